--[[
  seed_count(): seeds waiting in the list or, with REDIS_START_URLS_AS_SET (or anyone's
  `redis-cli sadd`), the set.

  Needs KEYS: start_urls.
]]
local function seed_count()
    -- a list or no key answers LLEN; a set refuses it (WRONGTYPE) and answers SCARD
    local n = redis.pcall('LLEN', K.start_urls)
    if type(n) == 'table' and n.err then n = redis.pcall('SCARD', K.start_urls) end
    if type(n) == 'table' and n.err then return 0 end -- a key of another type holds none
    return n
end
