--[[
  Phase 8, lease: up to `want` requests, best ready site first, each site
  within its token bucket (rate) and its fleet-wide concurrency cap. A site
  that must wait leaves the ready index for K.throttled, scored by when it may
  go again, so later leases skip it without looking at it.

  Keys: queue, throttled, inflight, limits, rates, buckets, active, leases, recent, queued,
        and the site queues.
  ARGV section: none.
  Options used: node, want, limits (rate, concurrency, burst_seconds, adaptive, start_rate)
  Returns: leased {site, payload, score, ...}, and whether the throttled set changed
]]
local MAX_SITES_PER_LEASE = 32  -- sites looked at per step, so one step stays short
local CONCURRENCY_RECHECK_MS = 100 -- a site at its cap is looked at again this much later

-- rate (requests/s, 0 = none) and concurrency cap (0 = none) of a site
local function site_limits(site, limits)
    local rate, conc = limits.rate, limits.concurrency
    local limit = redis.call('HGET', K.limits, site)
    if limit then
        local r, c = string.match(limit, '^(%S+) (%S+)$')
        rate, conc = tonumber(r), tonumber(c)
    end
    if limits.adaptive then
        local adaptive = tonumber(redis.call('HGET', K.rates, site) or limits.start_rate)
        if rate <= 0 or adaptive < rate then rate = adaptive end
    end
    return rate, conc
end

local function lease(want, now, deadline, node, limits)
    local leased = {}
    local throttled_changed = false
    local prefix = node .. '\nR'
    local scanned = 0
    while want > 0 and scanned < MAX_SITES_PER_LEASE do
        scanned = scanned + 1
        local best = redis.call('ZRANGE', K.queue, 0, 0)
        if #best == 0 then break end
        local site = best[1]
        local rate, conc = site_limits(site, limits)
        local allowed = want
        local active = 0
        if conc > 0 then
            active = tonumber(redis.call('HGET', K.active, site) or 0)
            allowed = math.min(allowed, conc - active)
        end
        local tokens = 0
        if rate > 0 then
            local burst = math.max(1, rate * limits.burst_seconds)
            local state = redis.call('HGET', K.buckets, site)
            tokens = 1
            if state then
                local t, last = string.match(state, '^(%S+) (%S+)$')
                tokens = math.min(burst, tonumber(t) + (now - tonumber(last)) / 1000 * rate)
            end
            allowed = math.min(allowed, math.floor(tokens))
        end
        local popped = {}
        if allowed > 0 then
            popped = redis.call('ZPOPMIN', site_key(site), allowed)
        end
        local n = #popped / 2
        if n > 0 then
            local args = {}
            for j = 1, #popped, 2 do
                args[#args + 1] = deadline
                args[#args + 1] = prefix .. site .. '\n' .. popped[j]
                leased[#leased + 1] = site
                leased[#leased + 1] = popped[j]
                leased[#leased + 1] = popped[j + 1]
            end
            chunked('ZADD', K.inflight, args, 2)
            redis.call('HINCRBY', K.active, site, n)
            redis.call('HINCRBY', K.leases, site, n)
            redis.call('ZADD', K.recent, now, site)
            redis.call('DECRBY', K.queued, n)
            want = want - n
            active = active + n
            tokens = tokens - n
        end
        if rate > 0 then redis.call('HSET', K.buckets, site, tokens .. ' ' .. now) end
        -- re-index: drop an empty site, park a site that must wait
        local wake_at = nil
        if rate > 0 and tokens < 1 then wake_at = now + math.ceil((1 - tokens) / rate * 1000) end
        if conc > 0 and active >= conc then
            wake_at = math.max(wake_at or 0, now + CONCURRENCY_RECHECK_MS)
        end
        local head = redis.call('ZRANGE', site_key(site), 0, 0, 'WITHSCORES')
        if #head == 0 then
            redis.call('ZREM', K.queue, site)
        elseif wake_at then
            redis.call('ZREM', K.queue, site)
            redis.call('ZADD', K.throttled, wake_at, site)
            throttled_changed = true
        else
            redis.call('ZADD', K.queue, head[2], site)
        end
    end
    return leased, throttled_changed
end
