--[[
  Phase 8, lease. First "ahead", for sites this node already works on: more of
  their requests, so that when one of its downloads ends the next one starts
  without a round trip (they take no permit), and permits for requests of theirs
  it holds but may not start yet, within the site's cap. Then the walk: up to
  `slots` requests with a permit each, best ready site first, each site within
  its token bucket (rate) and its fleet-wide cap of permits (lib/permits.lua). A
  site that must wait leaves the ready index: for K.throttled, scored by when it
  may go again (rate), or for K.capped until one of its permits comes back.

  A node holds at most its share of a site's cap, the cap divided by the nodes
  stepping (K.holders: each step renews the node's entry), so one node does not
  take a whole site while another waits; its permits above the share go back as
  its downloads end (project/frontier/loop.py).

  Keys: queue, throttled, capped, inflight, limits, rates, buckets, active, holders, leases,
        recent, queued, and the site queues.
  ARGV section, AHEAD_WIDTH values per site this node holds permits of or requests for:
    site, requests wanted, permits wanted, permits held, spare permits (held, with no
    request to start: the first requests taken ahead use them, the rest go back)
  Options used: node, want (requests in all), slots (permits), limits (rate, concurrency,
                burst_seconds, adaptive, start_rate)
  Returns: leased {site, payload, score, ...}, permits granted {site, n, ...}, whether the
           throttled set changed, for each site of the ahead section this node's share
           of its cap and the spare permits that went back {site, share, back, ...}, and
           whether this node was no holder any more: its deadline passed (it stalled) and
           maintenance gave its permits back, so it holds none of those it names
]]
local MAX_SITES_PER_LEASE = 32  -- sites looked at per step, so one step stays short
local AHEAD_WIDTH = 5

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

-- Tokens in a site's bucket now (rate > 0).
local function bucket_tokens(site, rate, now, limits)
    local state = redis.call('HGET', K.buckets, site)
    if not state then return 1 end
    local t, last = string.match(state, '^(%S+) (%S+)$')
    return math.min(math.max(1, rate * limits.burst_seconds),
                    tonumber(t) + (now - tonumber(last)) / 1000 * rate)
end

-- Take up to n requests of a site's queue as this node's leases; returns how many.
local function take(site, n, deadline, prefix, out)
    local popped = site_pop(site, n)
    if #popped == 0 then return 0 end
    local args = {}
    for j = 1, #popped, 2 do
        args[#args + 1] = deadline
        args[#args + 1] = prefix .. site .. '\n' .. popped[j]
        local l = out.leased
        l[#l + 1] = site
        l[#l + 1] = popped[j]
        l[#l + 1] = popped[j + 1]
    end
    chunked('ZADD', K.inflight, args, 2)
    local got = #popped / 2
    redis.call('HINCRBY', K.leases, site, got)
    out.recent[#out.recent + 1] = out.now
    out.recent[#out.recent + 1] = site
    out.taken = out.taken + got
    return got
end

-- A site leaves the ready index for K.throttled until its bucket has a token again.
local function park_for_rate(site, tokens, rate, now)
    redis.call('ZREM', K.queue, site)
    redis.call('ZADD', K.throttled, now + math.ceil((1 - tokens) / rate * 1000), site)
end

-- This node's share of a cap: the cap divided by the nodes stepping, rounded up.
local function share_of(conc, out)
    if not out.nodes then out.nodes = math.max(1, redis.call('ZCARD', K.holders)) end
    return math.ceil(conc / out.nodes)
end

-- Up to n new permits of a site for this node, within the site's cap and this node's
-- share of it (it holds `held`); returns how many.
local function grant(site, n, conc, held, out)
    if conc > 0 then
        n = math.min(n, conc - tonumber(redis.call('HGET', K.active, site) or 0),
                     share_of(conc, out) - held)
    end
    if n <= 0 then return 0 end
    redis.call('HINCRBY', K.active, site, n)
    redis.call('HINCRBY', out.holder, site, n)
    out.permits[#out.permits + 1] = site
    out.permits[#out.permits + 1] = n
    out.slots = out.slots - n
    return n
end

local function lease_ahead(at, count, out, limits)
    for e = 0, count - 1 do
        local i = at + e * AHEAD_WIDTH
        local site = ARGV[i]
        local n = math.min(tonumber(ARGV[i + 1]), out.want)
        local wanted = math.min(tonumber(ARGV[i + 2]), out.slots)
        local held, spare = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
        if out.rejoined then held, spare = 0, 0 end
        local rate, conc = site_limits(site, limits)
        local share = 0
        if conc > 0 then share = share_of(conc, out) end
        local got = 0
        -- a paused or rate-limited site waits in K.throttled: nothing ahead of its time
        if (n > 0 or wanted > 0) and not redis.call('ZSCORE', K.throttled, site) then
            if wanted > 0 then grant(site, wanted, conc, held, out) end
            local tokens = 0
            if rate > 0 then
                tokens = bucket_tokens(site, rate, out.now, limits)
                n = math.min(n, math.floor(tokens))
            end
            if n > 0 then
                got = take(site, n, out.deadline, out.prefix, out)
                out.want = out.want - got
                tokens = tokens - got
                -- emptied: out of the index (an index score below the new head is harmless)
                if got < n then redis.call('ZREM', K.queue, site) end
            end
            if rate > 0 and n > 0 then
                redis.call('HSET', K.buckets, site, tokens .. ' ' .. out.now)
                if tokens < 1 then
                    park_for_rate(site, tokens, rate, out.now)
                    out.throttled_changed = true
                end
            end
        end
        -- spare permits the requests just taken do not use go back, for other nodes
        local back = 0
        if spare > got then back = give_back(out.node, site, spare - got) end
        out.held[site] = held - back
        out.shares[#out.shares + 1] = site
        out.shares[#out.shares + 1] = share
        out.shares[#out.shares + 1] = back
    end
end

local function lease(at, n_ahead, opt, now, deadline, limits)
    local out = {leased = {}, permits = {}, recent = {}, taken = 0, want = opt.want,
                 slots = opt.slots or 0, now = now, deadline = deadline,
                 prefix = opt.node .. '\nR', holder = holder_key(opt.node),
                 throttled_changed = false, held = {}, shares = {}, nodes = nil,
                 node = opt.node}
    -- this node steps: it counts in every site's share until its deadline (1: it was no
    -- holder, its first step or its permits reclaimed)
    out.rejoined = redis.call('ZADD', K.holders, 'GT', deadline, opt.node) == 1
    lease_ahead(at, n_ahead, out, limits)
    local scanned, skip = 0, 0
    while out.slots > 0 and out.want > 0 and scanned < MAX_SITES_PER_LEASE do
        scanned = scanned + 1
        local best = redis.call('ZRANGE', K.queue, skip, skip)
        if #best == 0 then break end
        local site = best[1]
        local rate, conc = site_limits(site, limits)
        local allowed = math.min(out.slots, out.want)
        local active = 0
        if conc > 0 then
            active = tonumber(redis.call('HGET', K.active, site) or 0)
            allowed = math.min(allowed, conc - active, share_of(conc, out) - (out.held[site] or 0))
        end
        local tokens = 0
        if rate > 0 then
            tokens = bucket_tokens(site, rate, now, limits)
            allowed = math.min(allowed, math.floor(tokens))
        end
        local n = 0
        if allowed > 0 then n = take(site, allowed, deadline, out.prefix, out) end
        if n > 0 then
            redis.call('HINCRBY', K.active, site, n)
            redis.call('HINCRBY', out.holder, site, n)
            out.permits[#out.permits + 1] = site
            out.permits[#out.permits + 1] = n
            out.slots = out.slots - n
            out.want = out.want - n
            active = active + n
            tokens = tokens - n
        end
        if rate > 0 then redis.call('HSET', K.buckets, site, tokens .. ' ' .. now) end
        -- re-index: drop an emptied site, park a site that must wait
        if n < allowed then
            redis.call('ZREM', K.queue, site)
        elseif conc > 0 and active >= conc then
            redis.call('ZREM', K.queue, site)
            redis.call('SADD', K.capped, site)
        elseif n == 0 then
            skip = skip + 1 -- this node's share of it is used up: the next site, if any
        elseif rate > 0 and tokens < 1 then
            if site_has(site) then
                park_for_rate(site, tokens, rate, now)
                out.throttled_changed = true
            else
                redis.call('ZREM', K.queue, site)
            end
        else
            reindex_site(site)
        end
    end
    if out.taken > 0 then
        redis.call('DECRBY', K.queued, out.taken)
        chunked('ZADD', K.recent, out.recent, 2)
    end
    return out.leased, out.permits, out.throttled_changed, out.shares, out.rejoined
end
