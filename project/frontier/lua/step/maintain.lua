--[[
  Phase 6, maintenance (when options.maintain, about once a second per node):
  leases past their deadline go back to the queue (their node died or stalled),
  unless that entry's leases expired max_deliveries times: then it is a dead
  letter ("poison": it may be what kills the nodes); retries whose time has
  come go back to their site's queue, adaptive rates move towards
  target_concurrency / mean latency, the download permits of nodes that stopped
  stepping go back (lib/permits.lua), and the counters of sites idle for
  FORGET_AFTER_MS are deleted, so the per-site hashes do not grow for ever.

  Keys: inflight, delayed, dead, deliveries, limits, rates, lat_sum, lat_n, recent, buckets,
        throttled, holders, capped, active, and those of lib/leases.lua, lib/permits.lua
        and the site queues. Needs site_limits (lib/grants.lua, included before this).
  ARGV section: none.
  Options used: max_deliveries, limits (rate, adaptive, target_concurrency, min_rate,
                start_rate)
  Returns: reaped, promoted, poisoned {dead-letter record, ...}
]]
local Maintain = {}

do
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

    local PREVIEW_BYTES = 300 -- of a poisoned seed, in its dead letter

    -- The dead letter of an entry whose leases expired `n` times.
    local function poison_record(member, n, now)
        local nl = string.find(member, '\n', 1, true)
        local node, kind = string.sub(member, 1, nl - 1), string.sub(member, nl + 1, nl + 1)
        local record = {
            attempts = n, kind = 'poison', time = now / 1000, node = node,
            error = 'lease expired ' .. n .. ' times: each node that took it died or stalled',
        }
        if kind == CODE.seeds_list or kind == CODE.seeds_set then
            -- a raw seed: only a printable preview, it may not even be UTF-8
            local raw = string.sub(member, nl + 2, nl + 1 + PREVIEW_BYTES)
            record.url = string.gsub(raw, '[^\32-\126]', '?')
        else
            local site, payload = split_site(string.sub(member, nl + 2))
            local ok, doc = pcall(cjson.decode, payload)
            record.url = (ok and type(doc) == 'table' and type(doc.url) == 'string') and doc.url or ''
            record.site, record.request = site, payload
        end
        return cjson.encode(record)
    end

    -- Expired leases: count the delivery of each entry, and requeue or dead-letter it.
    local function reap(members, now, max_deliveries)
        local again, poisoned = {}, {}
        for _, m in ipairs(members) do
            local nl = string.find(m, '\n', 1, true)
            local id = redis.sha1hex(string.sub(m, nl + 1))
            local n = redis.call('HINCRBY', K.deliveries, id, 1)
            if n >= max_deliveries then
                redis.call('HDEL', K.deliveries, id)
                poisoned[#poisoned + 1] = poison_record(m, n, now)
            else
                again[#again + 1] = m
            end
        end
        if #poisoned > 0 then chunked('LPUSH', K.dead, poisoned) end
        return put_back(again), poisoned
    end

    local FORGET_AFTER_MS = 600000 -- an idle site's counters go 10 minutes after its last lease
    local FORGET_BATCH = 100       -- idle sites looked at per maintenance

    -- Forgetting a bucket gives the site one token: only once it has earned at least that.
    local function refilled(site, now, limits)
        local state = redis.call('HGET', K.buckets, site)
        if not state then return true end
        local t, last = string.match(state, '^(%S+) (%S+)$')
        if not t then return true end
        local rate = limits.rate
        local limit = redis.call('HGET', K.limits, site)
        if limit then rate = tonumber(string.match(limit, '^(%S+)')) or rate end
        if limits.adaptive then
            local adaptive = tonumber(redis.call('HGET', K.rates, site) or limits.start_rate)
            if rate <= 0 or adaptive < rate then rate = adaptive end
        end
        return rate <= 0 or tonumber(t) + (now - tonumber(last)) / 1000 * rate >= 1
    end

    -- Requests a site has queued: pushed less leased (lib/site_queues.lua's header).
    local function site_size(site)
        local n = tonumber(redis.call('HGET', sq.COUNTS, site))
        if n then return n - tonumber(redis.call('HGET', K.leases, site) or 0) end
        return redis.call('ZCARD', sq.older_key(site)) -- the older layout's, not adopted yet
    end

    local function forget_idle(now, limits)
        local old = redis.call('ZRANGEBYSCORE', K.recent, '-inf', now - FORGET_AFTER_MS,
                               'LIMIT', 0, FORGET_BATCH)
        for _, site in ipairs(old) do
            local busy = site_size(site) > 0
                or redis.call('ZSCORE', K.throttled, site)
                or tonumber(redis.call('HGET', K.active, site) or 0) > 0
                or not refilled(site, now, limits)
            if busy then
                redis.call('ZADD', K.recent, now, site) -- looked at again FORGET_AFTER_MS later
            else
                redis.call('HDEL', K.leases, site)
                redis.call('HDEL', sq.COUNTS, site) -- its pushed count (lib/site_queues.lua)
                redis.call('HDEL', K.buckets, site)
                redis.call('HDEL', K.active, site)
                redis.call('HDEL', K.lat_sum, site)
                redis.call('HDEL', K.lat_n, site)
                -- a site that was slowed down (429, Retry-After) stays slow
                local rate = tonumber(redis.call('HGET', K.rates, site) or '')
                if rate and rate >= limits.start_rate then redis.call('HDEL', K.rates, site) end
                redis.call('ZREM', K.recent, site)
            end
        end
    end

    local HOLDER_BATCH = 100 -- nodes past their deadline whose permits go back per step
    local CAPPED_CHECK = 50  -- capped sites looked at per step

    -- Permits of nodes that stopped stepping (died) go back; a capped site whose cap was
    -- raised, or whose permits went with a node, goes back to the ready index.
    local function reclaim_permits(now, limits)
        local gone = redis.call('ZRANGEBYSCORE', K.holders, '-inf', now, 'LIMIT', 0, HOLDER_BATCH)
        for _, node in ipairs(gone) do give_back_all(node) end
        local capped = redis.call('SRANDMEMBER', K.capped, CAPPED_CHECK)
        for _, site in ipairs(capped) do
            local _, conc = site_limits(site, limits)
            if conc <= 0 or tonumber(redis.call('HGET', K.active, site) or 0) < conc then uncap(site) end
        end
        return #gone
    end

    function Maintain.run(now, limits, max_deliveries)
        local reaped, promoted, poisoned = 0, 0, {}
        reclaim_permits(now, limits)
        local expired = redis.call('ZRANGEBYSCORE', K.inflight, '-inf', now, 'LIMIT', 0, REAP_BATCH)
        if #expired > 0 then
            chunked('ZREM', K.inflight, expired)
            reaped, poisoned = reap(expired, now, max_deliveries)
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
        forget_idle(now, limits)
        return reaped, promoted, poisoned
    end
end
