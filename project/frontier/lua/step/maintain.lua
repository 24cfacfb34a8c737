--[[
  Phase 6, maintenance (when options.maintain, about once a second per node):
  leases past their deadline go back to the queue (their node died or stalled),
  retries whose time has come go back to their site's queue, and adaptive
  rates move towards target_concurrency / mean latency.

  Keys: inflight, delayed, limits, rates, lat_sum, lat_n, and those of lib/leases.lua.
  ARGV section: none.
  Options used: limits (rate, adaptive, target_concurrency, min_rate, start_rate)
  Returns: reaped, promoted
]]
local REAP_BATCH = 1000     -- expired leases put back per step; the rest go next second
local PROMOTE_BATCH = 1000  -- due retries put back per step
local ADAPT_MIN_SAMPLES = 5 -- latency samples a site needs before its rate moves
local NO_RATE_CAP = 1e9     -- requests/s standing for "no cap" when a site has none
local MIN_LATENCY = 0.001   -- seconds: a faster mean would ask for an absurd rate

local function adapt(limits)
    local samples = redis.call('HGETALL', K.lat_n)
    for j = 1, #samples, 2 do
        local site, n = samples[j], tonumber(samples[j + 1])
        if n >= ADAPT_MIN_SAMPLES then
            local avg = tonumber(redis.call('HGET', K.lat_sum, site) or 0) / n
            local cap = NO_RATE_CAP
            local limit = redis.call('HGET', K.limits, site)
            if limit then
                local r = tonumber(string.match(limit, '^(%S+)'))
                if r and r > 0 then cap = r end
            elseif limits.rate > 0 then
                cap = limits.rate
            end
            local wanted = limits.target_concurrency / math.max(avg, MIN_LATENCY)
            local old = tonumber(redis.call('HGET', K.rates, site) or limits.start_rate)
            -- halfway to the wanted rate each time: smooth, yet quick to follow
            local rate = math.min(cap, math.max(limits.min_rate, (old + wanted) / 2))
            redis.call('HSET', K.rates, site, rate)
            redis.call('HDEL', K.lat_n, site)
            redis.call('HDEL', K.lat_sum, site)
        end
    end
end

local function maintain(now, limits)
    local reaped, promoted = 0, 0
    local expired = redis.call('ZRANGEBYSCORE', K.inflight, '-inf', now, 'LIMIT', 0, REAP_BATCH)
    if #expired > 0 then
        chunked('ZREM', K.inflight, expired)
        reaped = requeue(expired)
    end
    local due = redis.call('ZRANGEBYSCORE', K.delayed, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)
    if #due > 0 then
        chunked('ZREM', K.delayed, due)
        local items = {}
        for j, text in ipairs(due) do
            local site, payload = split_site(text)
            items[j] = {site, payload}
        end
        push_payloads(items)
        promoted = #due
    end
    if limits.adaptive then adapt(limits) end
    return reaped, promoted
end
