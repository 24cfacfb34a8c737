--[[
  What one step grants a node: leases of a site's requests and download permits, within
  the site's token bucket (rate) and its fleet-wide cap (lib/permits.lua), and this
  node's share of that cap. Shared by step/ahead.lua and step/walk.lua (and maintenance,
  which reads site_limits).

  A grant is three tables, built by begin_grant, which also renews the node in K.holders
  (it counts in every site's share until its deadline):
    ask     what the node asked, read-only: node, now, deadline, prefix (of its
            in-flight members), holder (its permits hash), nodes (holders stepping,
            read once when a cap needs it)
    budget  what is left to grant: want (requests), slots (new permits), held
            (site -> permits this node holds of the sites it named)
    got     what it was granted: leased {site, payload, score, ...}, permits {site, n,
            ...}, shares {site, share, back, ...}, recent {ms, site, ...} (K.recent),
            taken, throttled_changed, rejoined

  Needs KEYS: limits, rates, buckets, active, holders, leases, inflight, queue,
  throttled, and those of lib/site_queues.lua and lib/permits.lua.
]]

local function begin_grant(opt, now, deadline)
    local ask = {node = opt.node, now = now, deadline = deadline,
                 prefix = opt.node .. '\n' .. CODE.member_request,
                 holder = holder_key(opt.node), nodes = nil}
    local budget = {want = opt.want, slots = opt.slots or 0, held = {}}
    local got = {leased = {}, permits = {}, shares = {}, recent = {}, taken = 0,
                 throttled_changed = false}
    -- rejoined (1 from ZADD): this node was no holder, its first step or its deadline
    -- passed (it stalled) and maintenance gave its permits back: it holds none it names
    got.rejoined = redis.call('ZADD', K.holders, 'GT', deadline, opt.node) == 1
    return ask, budget, got
end

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

-- A site leaves the ready index for K.throttled until its bucket has a token again.
local function park_for_rate(site, tokens, rate, now)
    redis.call('ZREM', K.queue, site)
    redis.call('ZADD', K.throttled, now + math.ceil((1 - tokens) / rate * 1000), site)
end

-- This node's share of a cap: the cap divided by the nodes stepping, rounded up.
local function share_of(conc, ask)
    if not ask.nodes then ask.nodes = math.max(1, redis.call('ZCARD', K.holders)) end
    return math.ceil(conc / ask.nodes)
end

-- Take up to n requests of a site's queue as this node's leases; returns how many, and
-- the list they came from last when it may have more (site_pop's).
local function take(site, n, ask, budget, got)
    local popped, last = site_pop(site, n)
    if #popped == 0 then return 0 end
    local args = {}
    local leased = got.leased
    for j = 1, #popped, 2 do
        args[#args + 1] = ask.deadline
        args[#args + 1] = ask.prefix .. site .. '\n' .. popped[j]
        leased[#leased + 1] = site
        leased[#leased + 1] = popped[j]
        leased[#leased + 1] = popped[j + 1]
    end
    chunked('ZADD', K.inflight, args, 2)
    local n_got = #popped / 2
    redis.call('HINCRBY', K.leases, site, n_got)
    got.recent[#got.recent + 1] = ask.now
    got.recent[#got.recent + 1] = site
    got.taken = got.taken + n_got
    budget.want = budget.want - n_got
    return n_got, last
end

-- n permits of a site become this node's (the caller checked the cap and the share).
local function record_permits(site, n, ask, budget, got)
    redis.call('HINCRBY', K.active, site, n)
    redis.call('HINCRBY', ask.holder, site, n)
    got.permits[#got.permits + 1] = site
    got.permits[#got.permits + 1] = n
    budget.slots = budget.slots - n
end

-- Up to n new permits of a site for this node, within the site's cap and this node's
-- share of it (it holds `held`); returns how many.
local function grant(site, n, conc, held, ask, budget, got)
    if conc > 0 then
        n = math.min(n, conc - tonumber(redis.call('HGET', K.active, site) or 0),
                     share_of(conc, ask) - held)
    end
    if n <= 0 then return 0 end
    record_permits(site, n, ask, budget, got)
    return n
end

-- After the grants: the ready sites' count and when each was last leased.
local function close_grant(got)
    if got.taken > 0 then
        redis.call('DECRBY', K.queued, got.taken)
        chunked('ZADD', K.recent, got.recent, 2)
    end
end
