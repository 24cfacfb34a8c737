"""Lua scripts of the shared frontier: each call is one atomic round trip.

Layout (``Q`` is the queue key, ``products:requests`` by default):

- ``Q:<site>``: a site's requests, scored ``-priority * 1e10 + seq``, so
  the best priority comes first and equal priorities first-in first-out.
- ``Q``: the index of *ready* sites, each scored by its best request. A
  lease walks it best-first; a site that is out of tokens or at its
  concurrency limit leaves the index for ``throttled`` (scored by the time
  it may go again), so it is skipped without rescanning its requests.
- ``inflight``: leases, ``<node>\\n<kind><payload>`` scored by deadline;
  kind ``R`` is a request, ``S`` a raw seed.
- ``limits`` (site -> "rate concurrency", fleet-wide caps), ``rates``
  (site -> adaptive rate), ``buckets`` (site -> "tokens last_ms"),
  ``active`` (site -> leases in flight), ``leases`` (site -> leases ever
  granted), ``lat_sum``/``lat_n`` (latency samples for adaptive throttling).

Per-site keys are built inside the scripts, so this needs one Redis server,
not a cluster.
"""

from __future__ import annotations

__all__ = ["RELEASE", "REQUEUE_DEAD", "STEP", "WIDE_KEYS"]

#: Order of the keys every script receives.
WIDE_KEYS = (
    "queue",
    "inflight",
    "delayed",
    "dupefilter",
    "seq",
    "start_urls",
    "dead",
    "throttled",
    "limits",
    "rates",
    "buckets",
    "active",
    "leases",
    "lat_sum",
    "lat_n",
    "queued",
)

_COMMON = r"""
local K = {}
for j, name in ipairs({'queue', 'inflight', 'delayed', 'seen', 'seq', 'seeds', 'dead',
        'throttled', 'limits', 'rates', 'buckets', 'active', 'leases', 'lat_sum', 'lat_n',
        'queued'}) do
    K[name] = KEYS[j]
end

local function clamp_priority(priority)
    if priority > 100000 then return 100000 end
    if priority < -100000 then return -100000 end
    return priority
end

local function site_of(payload)
    -- FLEET_SITE_KEY = 'ip' puts the resolved site in front of the URL
    local tagged = string.match(payload, '^{"site":"([^"]+)"')
    if tagged then return tagged end
    local site = string.match(payload, '^{"url":"%a[%w+.-]*://([^/"?#]+)')
    if site then return string.lower(site) end
    return '_'
end

local function priority_of(payload)
    local ok, doc = pcall(cjson.decode, payload)
    if ok and type(doc) == 'table' and type(doc['priority']) == 'number' then
        return clamp_priority(doc['priority'])
    end
    return 0
end

-- Put a site back in the ready index at its best request, unless throttled.
local function index_site(site)
    if redis.call('ZSCORE', K.throttled, site) then return end
    local head = redis.call('ZRANGE', K.queue .. ':' .. site, 0, 0, 'WITHSCORES')
    if #head > 0 then
        redis.call('ZADD', K.queue, head[2], site)
    else
        redis.call('ZREM', K.queue, site)
    end
end

-- Add {site -> {score, payload, ...}} to the site queues and the index.
local function push_grouped(by_site)
    local total = 0
    for site, args in pairs(by_site) do
        total = total + redis.call('ZADD', K.queue .. ':' .. site, unpack(args))
        if not redis.call('ZSCORE', K.throttled, site) then
            -- LT: only ever lowers a ready site's score to its new best request
            redis.call('ZADD', K.queue, 'LT', args[1], site)
        end
    end
    if total > 0 then redis.call('INCRBY', K.queued, total) end
end

-- Payloads that go back to the queue: fresh sequence numbers, same priority.
local function push_payloads(payloads)
    if #payloads == 0 then return end
    local base = redis.call('INCRBY', K.seq, #payloads) - #payloads
    local by_site = {}
    for j, payload in ipairs(payloads) do
        local site = site_of(payload)
        local args = by_site[site]
        if not args then args = {}; by_site[site] = args end
        local score = -priority_of(payload) * 1e10 + base + j
        if #args > 0 and score < args[1] then
            table.insert(args, 1, payload); table.insert(args, 1, score)
        else
            args[#args + 1] = score; args[#args + 1] = payload
        end
    end
    push_grouped(by_site)
end

-- In-flight members leave: count them off their sites' active leases.
local function release_active(members)
    local per_site = {}
    for _, m in ipairs(members) do
        local nl = string.find(m, '\n', 1, true)
        if string.sub(m, nl + 1, nl + 1) == 'R' then
            local site = site_of(string.sub(m, nl + 2))
            per_site[site] = (per_site[site] or 0) + 1
        end
    end
    for site, n in pairs(per_site) do
        if redis.call('HINCRBY', K.active, site, -n) < 0 then
            redis.call('HSET', K.active, site, 0)
        end
    end
end

-- Expired or released in-flight members go back where they came from.
local function requeue(members)
    release_active(members)
    local payloads, seeds = {}, {}
    for _, m in ipairs(members) do
        local nl = string.find(m, '\n', 1, true)
        local body = string.sub(m, nl + 1)
        if string.sub(body, 1, 1) == 'S' then
            seeds[#seeds + 1] = string.sub(body, 2)
        else
            payloads[#payloads + 1] = string.sub(body, 2)
        end
    end
    push_payloads(payloads)
    if #seeds > 0 then redis.call('RPUSH', K.seeds, unpack(seeds)) end
    return #payloads + #seeds
end
"""

# ARGV: node, now_ms, deadline_ms, want, seed_want, maintain,
#       default_rate, default_concurrency, burst_seconds,
#       auto (0/1), target_concurrency, min_rate, start_rate,
#       n_enqueue, n_ack, n_retry, n_dead, n_heartbeat, n_pause, n_latency,
#       then per entry:
#       enqueue: mode+fingerprint ('f' filter, 'm' dont_filter: mark only), site, priority, payload
#       ack: member
#       retry: member, not_before_ms, payload
#       dead: member, record
#       heartbeat: member
#       pause: site, until_ms
#       latency: site, seconds_sum, count
# Returns {added, duplicates, leased{payload, score, ...}, seeds{...},
#          reaped, promoted, counts{queued, delayed, inflight, seeds} or {},
#          next throttled wake-up in ms or false}
STEP = (
    _COMMON
    + r"""
local node, now, deadline = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want, seed_want, maintain = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local default_rate, default_conc = tonumber(ARGV[7]), tonumber(ARGV[8])
local burst_seconds = tonumber(ARGV[9])
local auto, target, min_rate, start_rate =
    ARGV[10] == '1', tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local n_enq, n_ack, n_retry, n_dead, n_hb, n_pause, n_lat = tonumber(ARGV[14]),
    tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18]),
    tonumber(ARGV[19]), tonumber(ARGV[20])
local i = 21
local prefix = node .. '\n'

-- 1. enqueue: one SMISMEMBER + one SADD for the batch, one ZADD per site
local added, dupes = 0, 0
if n_enq > 0 then
    local fps = {}
    for e = 0, n_enq - 1 do fps[#fps + 1] = string.sub(ARGV[i + e * 4], 2) end
    local flags = redis.call('SMISMEMBER', K.seen, unpack(fps))
    local batch_fps, fresh, new_fps = {}, {}, {}
    for e = 0, n_enq - 1 do
        local fp = fps[e + 1]
        local filter = string.sub(ARGV[i + e * 4], 1, 1) == 'f'
        local seen = flags[e + 1] == 1 or batch_fps[fp]
        if filter and seen then
            dupes = dupes + 1
        else
            if not seen then
                batch_fps[fp] = true
                new_fps[#new_fps + 1] = fp
            end
            fresh[#fresh + 1] = e
        end
    end
    if #new_fps > 0 then redis.call('SADD', K.seen, unpack(new_fps)) end
    if #fresh > 0 then
        local base = redis.call('INCRBY', K.seq, #fresh) - #fresh
        local by_site = {}
        for j, e in ipairs(fresh) do
            local site = ARGV[i + e * 4 + 1]
            local args = by_site[site]
            if not args then args = {}; by_site[site] = args end
            local score = -clamp_priority(tonumber(ARGV[i + e * 4 + 2])) * 1e10 + base + j
            if #args > 0 and score < args[1] then
                table.insert(args, 1, ARGV[i + e * 4 + 3]); table.insert(args, 1, score)
            else
                args[#args + 1] = score; args[#args + 1] = ARGV[i + e * 4 + 3]
            end
        end
        push_grouped(by_site)
        added = #fresh
    end
    i = i + n_enq * 4
end

-- 2. acknowledgements, retries and dead letters leave the in-flight set
local done = {}
for e = 0, n_ack - 1 do done[#done + 1] = ARGV[i + e] end
i = i + n_ack
if n_retry > 0 then
    local zargs = {}
    for e = 0, n_retry - 1 do
        done[#done + 1] = ARGV[i + e * 3]
        zargs[#zargs + 1] = ARGV[i + e * 3 + 1]
        zargs[#zargs + 1] = ARGV[i + e * 3 + 2]
    end
    redis.call('ZADD', K.delayed, unpack(zargs))
    i = i + n_retry * 3
end
if n_dead > 0 then
    local records = {}
    for e = 0, n_dead - 1 do
        done[#done + 1] = ARGV[i + e * 2]
        records[#records + 1] = ARGV[i + e * 2 + 1]
    end
    redis.call('LPUSH', K.dead, unpack(records))
    i = i + n_dead * 2
end
if #done > 0 then
    -- only members still held count off (a reaped lease was already counted)
    local held = {}
    local scores = redis.call('ZMSCORE', K.inflight, unpack(done))
    for j, m in ipairs(done) do
        if scores[j] then held[#held + 1] = m end
    end
    if #held > 0 then
        redis.call('ZREM', K.inflight, unpack(held))
        release_active(held)
    end
end

-- 3. heartbeat: extend this node's leases (XX: never resurrect a reaped one)
if n_hb > 0 then
    local args = {'XX'}
    for e = 0, n_hb - 1 do
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[i + e]
    end
    redis.call('ZADD', K.inflight, unpack(args))
    i = i + n_hb
end

-- 4. pauses (Retry-After): the site waits, fleet-wide; adaptive rate halves
for e = 0, n_pause - 1 do
    local site, until_ms = ARGV[i + e * 2], tonumber(ARGV[i + e * 2 + 1])
    redis.call('ZREM', K.queue, site)
    redis.call('ZADD', K.throttled, 'GT', until_ms, site)
    if auto then
        local rate = tonumber(redis.call('HGET', K.rates, site) or start_rate)
        redis.call('HSET', K.rates, site, math.max(min_rate, rate / 2))
    end
end
i = i + n_pause * 2

-- 5. latency samples for adaptive throttling
for e = 0, n_lat - 1 do
    local site = ARGV[i + e * 3]
    redis.call('HINCRBYFLOAT', K.lat_sum, site, ARGV[i + e * 3 + 1])
    redis.call('HINCRBY', K.lat_n, site, ARGV[i + e * 3 + 2])
end
i = i + n_lat * 3

-- 6. maintenance: reap expired leases, promote due retries, adapt rates
local reaped, promoted = 0, 0
if maintain then
    local expired = redis.call('ZRANGEBYSCORE', K.inflight, '-inf', now, 'LIMIT', 0, 1000)
    if #expired > 0 then
        redis.call('ZREM', K.inflight, unpack(expired))
        reaped = requeue(expired)
    end
    local due = redis.call('ZRANGEBYSCORE', K.delayed, '-inf', now, 'LIMIT', 0, 1000)
    if #due > 0 then
        redis.call('ZREM', K.delayed, unpack(due))
        push_payloads(due)
        promoted = #due
    end
    if auto then
        local samples = redis.call('HGETALL', K.lat_n)
        for j = 1, #samples, 2 do
            local site, n = samples[j], tonumber(samples[j + 1])
            if n >= 5 then
                local avg = tonumber(redis.call('HGET', K.lat_sum, site) or 0) / n
                local cap = 1e9
                local limit = redis.call('HGET', K.limits, site)
                if limit then
                    local r = tonumber(string.match(limit, '^(%S+)'))
                    if r and r > 0 then cap = r end
                elseif default_rate > 0 then
                    cap = default_rate
                end
                local wanted = target / math.max(avg, 0.001)
                local old = tonumber(redis.call('HGET', K.rates, site) or start_rate)
                local rate = math.min(cap, math.max(min_rate, (old + wanted) / 2))
                redis.call('HSET', K.rates, site, rate)
                redis.call('HDEL', K.lat_n, site)
                redis.call('HDEL', K.lat_sum, site)
            end
        end
    end
end

-- 7. wake throttled sites whose time has come (one read when none is due)
local throttled_changed = n_pause > 0
local first = redis.call('ZRANGE', K.throttled, 0, 0, 'WITHSCORES')
if #first > 0 and tonumber(first[2]) <= now then
    local woken = redis.call('ZRANGEBYSCORE', K.throttled, '-inf', now, 'LIMIT', 0, 100)
    redis.call('ZREM', K.throttled, unpack(woken))
    for _, site in ipairs(woken) do index_site(site) end
    throttled_changed = true
end

-- 8. lease: best ready site first, within its tokens and concurrency
local leased = {}
local scanned = 0
while want > 0 and scanned < 32 do
    scanned = scanned + 1
    local best = redis.call('ZRANGE', K.queue, 0, 0)
    if #best == 0 then break end
    local site = best[1]
    local rate, conc = default_rate, default_conc
    local limit = redis.call('HGET', K.limits, site)
    if limit then
        local r, c = string.match(limit, '^(%S+) (%S+)$')
        rate, conc = tonumber(r), tonumber(c)
    end
    if auto then
        local adaptive = tonumber(redis.call('HGET', K.rates, site) or start_rate)
        if rate <= 0 or adaptive < rate then rate = adaptive end
    end
    local allowed = want
    local active = 0
    if conc > 0 then
        active = tonumber(redis.call('HGET', K.active, site) or 0)
        allowed = math.min(allowed, conc - active)
    end
    local tokens = 0
    if rate > 0 then
        local burst = math.max(1, rate * burst_seconds)
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
        popped = redis.call('ZPOPMIN', K.queue .. ':' .. site, allowed)
    end
    local n = #popped / 2
    if n > 0 then
        local args = {}
        for j = 1, #popped, 2 do
            args[#args + 1] = deadline
            args[#args + 1] = prefix .. 'R' .. popped[j]
            leased[#leased + 1] = popped[j]
            leased[#leased + 1] = popped[j + 1]
        end
        redis.call('ZADD', K.inflight, unpack(args))
        redis.call('HINCRBY', K.active, site, n)
        redis.call('HINCRBY', K.leases, site, n)
        redis.call('DECRBY', K.queued, n)
        want = want - n
        active = active + n
        tokens = tokens - n
    end
    if rate > 0 then redis.call('HSET', K.buckets, site, tokens .. ' ' .. now) end
    -- re-index: drop an empty site, park a site that must wait
    local wake = nil
    if rate > 0 and tokens < 1 then wake = now + math.ceil((1 - tokens) / rate * 1000) end
    if conc > 0 and active >= conc then wake = math.max(wake or 0, now + 100) end
    local head = redis.call('ZRANGE', K.queue .. ':' .. site, 0, 0, 'WITHSCORES')
    if #head == 0 then
        redis.call('ZREM', K.queue, site)
    elseif wake then
        redis.call('ZREM', K.queue, site)
        redis.call('ZADD', K.throttled, wake, site)
        throttled_changed = true
    else
        redis.call('ZADD', K.queue, head[2], site)
    end
end

-- 9. seeds are leased too, so a node that dies with them does not lose them
local seeds = {}
if seed_want > 0 then
    local popped = redis.call('RPOP', K.seeds, seed_want)
    if popped then
        local args = {}
        for _, raw in ipairs(popped) do
            args[#args + 1] = deadline
            args[#args + 1] = prefix .. 'S' .. raw
            seeds[#seeds + 1] = raw
        end
        redis.call('ZADD', K.inflight, unpack(args))
    end
end

local counts = {}
if maintain then
    counts = {tonumber(redis.call('GET', K.queued) or 0), redis.call('ZCARD', K.delayed),
              redis.call('ZCARD', K.inflight), redis.call('LLEN', K.seeds)}
end
-- when the next throttled site may go (so an idle node need not poll blindly)
local next_wake = first
if throttled_changed then next_wake = redis.call('ZRANGE', K.throttled, 0, 0, 'WITHSCORES') end
return {added, dupes, leased, seeds, reaped, promoted, counts, next_wake[2] or false}
"""
)

# Give back everything a node holds (clean shutdown). ARGV: members.
RELEASE = (
    _COMMON
    + r"""
local held = {}
for _, m in ipairs(ARGV) do
    if redis.call('ZREM', K.inflight, m) == 1 then held[#held + 1] = m end
end
if #held == 0 then return 0 end
return requeue(held)
"""
)

# Move dead letters back to the queue. ARGV: pairs of (raw dead record,
# payload to queue); a record another client already removed is skipped.
REQUEUE_DEAD = (
    _COMMON
    + r"""
local payloads = {}
for j = 1, #ARGV, 2 do
    if redis.call('LREM', K.dead, 1, ARGV[j]) == 1 then payloads[#payloads + 1] = ARGV[j + 1] end
end
push_payloads(payloads)
return #payloads
"""
)
