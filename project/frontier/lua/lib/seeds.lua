--[[
  seed_count(): seeds waiting in the list or, with REDIS_START_URLS_AS_SET (or anyone's
  `redis-cli sadd`), the set.

  Needs KEYS: start_urls.
]]
local function seed_count()
    if redis.call('TYPE', K.start_urls).ok == 'set' then return redis.call('SCARD', K.start_urls) end
    return redis.call('LLEN', K.start_urls)
end
