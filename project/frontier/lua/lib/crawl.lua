--[[
  What is left of a crawl, as every script that judges it counts it.

  work_left(): requests queued, retries delayed, leases out and seeds waiting.
  start_running(): 1 while some node runs start() (lua/start.lua).
  fleet_counts(all): the same as name/value pairs (queued, inflight, delayed, seeds,
  starting); all of them, or (all false) up to the first above zero, which is enough to
  tell that the crawl goes on.

  Needs KEYS: queued, delayed, inflight, start_urls, start.
]]
--@include lib/seeds.lua

local function work_left()
    return tonumber(redis.call('GET', K.queued) or 0) + redis.call('ZCARD', K.delayed)
           + redis.call('ZCARD', K.inflight) + seed_count()
end

local function start_running()
    local held = redis.call('GET', K.start)
    if held and string.sub(held, 1, #CODE.start_extend + 1) == CODE.start_extend .. '\n' then return 1 end
    return 0
end

local function fleet_counts(all)
    local counts = {}
    for _, counted in ipairs({
        {'queued', function() return tonumber(redis.call('GET', K.queued) or 0) end},
        {'inflight', function() return redis.call('ZCARD', K.inflight) end},
        {'delayed', function() return redis.call('ZCARD', K.delayed) end},
        {'seeds', seed_count},
        {'starting', start_running},
    }) do
        local n = counted[2]()
        counts[#counts + 1] = counted[1]
        counts[#counts + 1] = n
        if n > 0 and not all then break end
    end
    return counts
end
