--[[
  What is left of a crawl, as every script that judges it counts it.

  work_left(): requests queued, retries delayed, leases out and seeds waiting.
  start_running(): 1 while some node runs start() (lua/start.lua).

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
