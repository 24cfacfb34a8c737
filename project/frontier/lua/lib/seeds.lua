--[[
  seed_count(): seeds waiting in the list or, with REDIS_START_URLS_AS_SET (or anyone's
  `redis-cli sadd`), the set.

  Needs KEYS: start_urls. Also refused(reply), for the step's seed phase (step/seeds.lua).
]]
-- Whether a redis.pcall reply is an error (WRONGTYPE, here).
local function refused(reply)
    return type(reply) == 'table' and reply.err ~= nil
end

local function seed_count()
    -- a list or no key answers LLEN; a set refuses it (WRONGTYPE) and answers SCARD
    local n = redis.pcall('LLEN', K.start_urls)
    if refused(n) then n = redis.pcall('SCARD', K.start_urls) end
    if refused(n) then return 0 end -- a key of another type holds none
    return n
end
