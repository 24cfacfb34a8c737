--[[
  Phase 9, seeds: raw seeds from <spider>:start_urls are leased like requests,
  so a node that dies before it enqueued them does not lose them (they go back
  where they came from when the lease expires: lib/leases.lua).

  Keys: start_urls, inflight.
  ARGV section: none.
  Options used: node, seed_want, seeds_set (REDIS_START_URLS_AS_SET: SPOP, not RPOP)
  Returns: seeds {raw, ...}
]]
local function take_seeds(count, deadline, node, as_set)
    local seeds = {}
    if count <= 0 then return seeds end
    local popped
    if as_set then popped = redis.call('SPOP', K.start_urls, count)
    else popped = redis.call('RPOP', K.start_urls, count) end
    if not popped or #popped == 0 then return seeds end
    local args = {}
    -- 'T': a seed of a set, which goes back to the set
    local prefix = node .. (as_set and '\nT' or '\nS')
    for _, raw in ipairs(popped) do
        args[#args + 1] = deadline
        args[#args + 1] = prefix .. raw
        seeds[#seeds + 1] = raw
    end
    chunked('ZADD', K.inflight, args, 2)
    return seeds
end

-- Seeds waiting, in a list or (REDIS_START_URLS_AS_SET) a set
local function seed_count()
    if redis.call('TYPE', K.start_urls).ok == 'set' then return redis.call('SCARD', K.start_urls) end
    return redis.call('LLEN', K.start_urls)
end
