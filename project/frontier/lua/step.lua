--[[
  One tick of a node's frontier, as one atomic round trip: enqueue what the
  node discovered, settle what it finished, extend what it still holds, give
  back download permits it has no request for, pause sites that asked for it,
  record latencies, reap and promote (maintenance), wake throttled sites, lease
  the next batch within every site's limits, and take a few seeds. Each phase is
  its own file under step/.

  Input:
    KEYS[1]  queue       ready sites, scored by their best request (SCHEDULER_QUEUE_KEY)
    KEYS[2]  inflight    leases, scored by deadline (lib/leases.lua has the members)
    KEYS[3]  delayed     retries "<site>\n<payload>", scored by when they are due
    KEYS[4]  dupefilter  the seen-set (SCHEDULER_DUPEFILTER_KEY), in lib/seen.lua's forms
    KEYS[5]  seq         arrival counter, for first-in first-out within a priority
    KEYS[6]  start_urls  seeds pushed with `redis-cli lpush` (REDIS_START_URLS_KEY)
    KEYS[7]  dead        dead letters, JSON records, newest first
    KEYS[8]  throttled   sites that must wait, scored by when they may go again
    KEYS[9]  limits      site -> "rate concurrency", fleet-wide caps of single sites
    KEYS[10] rates       site -> adaptive rate (FRONTIER_AUTOTHROTTLE_ENABLED)
    KEYS[11] buckets     site -> "tokens last_ms" of its token bucket
    KEYS[12] active      site -> download permits held (lib/permits.lua)
    KEYS[13] leases      site -> leases ever granted (achieved rates in status)
    KEYS[14] lat_sum     site -> latency seconds since the last adaptation
    KEYS[15] lat_n       site -> latency samples since the last adaptation
    KEYS[16] queued      requests queued over all sites
    KEYS[17] deliveries  sha1 of an in-flight member's body -> times its lease expired
    KEYS[18] allowed     sites requests found on pages may go to (seeds' sites, redirects)
    KEYS[19] recent      site -> when it was last leased (ms, Redis clock)
    KEYS[20] start       the claim on the spider's start() (start.lua): 'run\n<node>' or 'done'
    KEYS[21] capped      sites at their concurrency cap, out of the ready index
    KEYS[22] holders     nodes stepping (they may hold download permits), scored by deadline
    KEYS[23] revisit     fingerprint -> what its last fetch left for a revisit (step/revisit.lua)
    KEYS[24] due         fingerprints under a revisit policy, scored by when they are due
    KEYS[25] runs        the fleet's current crawl run (lua/run_join.lua)
    KEYS[26] sessions    the fleet's sessions, by site (step/sessions.lua)
    KEYS[27] proxies     the health of each (proxy, site) pair (step/sessions.lua)
    KEYS[28] render      which pages need a browser, by pattern (step/render.lua)

    ARGV[1]  options, one JSON object:
               node            this node's id (no newline)
               lease_ms        how long a lease lasts without a heartbeat
               want            requests to lease in all
               slots           of them, at most this many with a new download permit
                               (the rest go "ahead": step/ahead.lua)
               seed_want       seeds to take
               maintain        true: run maintenance and return the counts
               count           true: return the counts without maintenance (an idle node
                               looking for the end of the crawl), up to the first above
                               zero (lib/crawl.lua's fleet_counts)
               max_deliveries  an entry whose lease expired this often is a dead letter
               limits          {rate, concurrency, burst_seconds, adaptive,
                               target_concurrency, min_rate, start_rate}: the defaults
                               for every site without an entry in `limits`
               sections        the layout of ARGV[2..]: {{name, entries, {field, ...}},
                               ...} (lib/sections.lua)
               list_dupes      true: return where the duplicates are in the batch
                               (DUPEFILTER_DEBUG)
               seen            the seen-set's form (lib/seen.lua); absent: a set
               runs            true: the fleet keeps crawl runs; a seed is queued once in
                               each (step/enqueue.lua)
               revisit         with maintain: hand out up to this many due revisits
                               (FRONTIER_KEEP_ALIVE, step/revisit.lua)
               join_first      true: take seeds only once this node is in the crawl run
                               (not a keep-alive fleet, whose runs begin with work)
               seq             this node's number for this step, as text (its batch, sent again
                               after an error keeps it): a step of the seq it ran last
                               does nothing (replayed)
               permit_table    true: the permit_table section is this node's whole table
                               of permits (each heartbeat); Redis corrects to it
               revisit_limits  {records in all, of a site, runs and ms a record may go
                               unrediscovered}: FRONTIER_REVISIT_MAX_URLS and the like
               sweep           with count, when the fleet has nothing left: queue up to
                               this many due revisits of URLs this run has not seen
                               (FRONTIER_REVISIT_SWEEP)
               sessions        the sessions' limits and the sites whose sessions this node
                               asks for (step/sessions.lua); absent: no sessions
               render          adaptive rendering: the version of the patterns this node
                               knows, and their limits (step/render.lua); absent: off
               release         true: the node closes; after the settlements, every permit it
                               holds goes back, and the release section's leases to the
                               queue (step/release.lua)
               start           CODE.start_extend: extend this node's claim on start();
                               CODE.start_end: its start() is over and its requests are
                               in (this step enqueues the last)
    ARGV[2..] the sections, each described by the phase that reads it: enqueue, ack,
              retry, dead, revisit, heartbeat, give_back, permit_table, pause, latency,
              session, render, ahead, release

  Reply: name/value pairs {name, value, name, value, ...}:
    added         requests queued
    duplicates    requests dropped as seen
    offsite       requests dropped for their scope
    duplicate_at  {batch position of a duplicate, ...} when list_dupes
    rediscovered  seen URLs queued again because their revisit was due
    still_linked  {record, ...} of URLs rediscovered before their revisit is due
    stale         settlements dropped: their lease had been reaped meanwhile
    reaped        expired leases put back (maintenance)
    promoted      due retries put back (maintenance)
    poisoned      {dead-letter record, ...} of entries whose leases expired max_deliveries
                  times
    handed_out    due revisits queued by maintenance (options.revisit) or the sweep
    revisits_capped     new revisit records left out by the caps (options.revisit_limits)
    revisits_forgotten  revisit records the sweep forgot (not rediscovered for long)
    permits_fixed  with permit_table: permits Redis counted for this node beyond its table,
                  given back (step/permits.lua)
    permits_held  with permit_table: {site, n, ...} where the node counts more than Redis
    leased        {site, payload, score, ...}
    permits       download permits granted {site, n, ...}
    shares        {site, share, back, ...} for each site of the ahead section: this
                  node's share of its cap (0: no cap), and its spare permits that went back
    rejoined      1 if this node was no permit holder any more (its first step, or it
                  stalled past its deadline and its permits went back to the fleet), else 0
    seeds         {raw, ...}
    seeds_kind    CODE.seeds_list when the seeds came from a list, CODE.seeds_set from a
                  set (their in-flight members)
    start_held    1 if this node still holds the start claim it asked to extend or end
    counts        {queued, n, inflight, n, delayed, n, seeds, n, starting, n} (name/value
                  pairs; starting: 1 while a node runs start()), and seen, n for a Bloom
                  seen-set, with maintain or count (only up to the first above zero
                  without maintain), else {}; and revisits, n: what the sweep queued (plus 1
                  when due revisits are left it has not looked at yet)
    wait_ms       milliseconds until the next throttled site may go, or nil
    now           Redis' time of this step, ms (the fleet's clock: project/frontier/clock.py)
    replayed      1: a step of this seq ran already; it did nothing (the rest is empty)
    sessions      {site, version, sessions JSON, pairs JSON, ...} of the sites asked for
                  whose sessions changed (step/sessions.lua)
    retired       sessions this step retired
    probes        {"<site>\n<proxy>", ...}: the pairs on probation this node may try
                  (step/sessions.lua)
    sites_forgotten  sites whose sessions and pairs maintenance forgot (idle long)
    render        {version, changes JSON, full}: the patterns changed since the version the
                  node knows (step/render.lua), or {} without options.render
    patterns_forgotten  patterns maintenance forgot (no outcome for long)
    released      with options.release: the unstarted leases that went back to the queue
]]
--@include lib/time.lua
--@include lib/chunked.lua
--@include lib/site_queues.lua
--@include lib/leases.lua
--@include lib/permits.lua
--@include lib/crawl.lua
--@include lib/seen.lua
--@include lib/sections.lua
--@include lib/grants.lua
--@include step/revisit.lua
--@include step/enqueue.lua
--@include step/settle.lua
--@include step/heartbeat.lua
--@include step/permits.lua
--@include step/pause.lua
--@include step/latency.lua
--@include step/sessions.lua
--@include step/render.lua
--@include step/ahead.lua
--@include step/walk.lua
--@include step/maintain.lua
--@include step/wake.lua
--@include step/seeds.lua
--@include step/start.lua
--@include step/release.lua

local opt = cjson.decode(ARGV[1])
if opt.seq and redis.call('SET', K.holders .. ':seq:' .. opt.node, opt.seq,
                          'PX', 10 * opt.lease_ms, 'GET') == opt.seq then
    -- this step ran already (a reply lost, the step sent again): nothing runs twice; what
    -- the first run granted comes back as its leases expire and its permits by the table
    return {'added', 0, 'duplicates', 0, 'offsite', 0, 'duplicate_at', {}, 'rediscovered', 0,
            'still_linked', {}, 'stale', 0, 'reaped', 0, 'promoted', 0, 'poisoned', {},
            'handed_out', 0, 'revisits_capped', 0, 'revisits_forgotten', 0, 'permits_fixed', 0,
            'permits_held', {}, 'leased', {}, 'permits', {}, 'shares', {}, 'rejoined', 0,
            'seeds', {}, 'seeds_kind', CODE.seeds_list, 'start_held', 0, 'counts', {},
            'wait_ms', false, 'now', now_ms(), 'replayed', 1, 'sessions', {}, 'retired', 0,
            'probes', {}, 'sites_forgotten', 0, 'render', {}, 'patterns_forgotten', 0,
            'released', 0}
end
local S = read_sections(opt.sections)
local limits = opt.limits
local now = now_ms()
local deadline = now + opt.lease_ms

local added, dupes, offsite, dupe_list, rediscovered, still = Enqueue.run(S.enqueue, opt, now)
local stale = Settle.run(S.ack, S.retry, S.dead, now)
local revisits_capped = Revisit.record(S.revisit, now, opt.revisit_limits)
local revisits_forgotten = 0
Heartbeat.run(S.heartbeat, deadline)
PermitsBack.run(S.give_back, opt.node)
local permits_fixed, permits_held = 0, {}
if opt.permit_table then permits_fixed, permits_held = PermitsBack.reconcile(S.permit_table, opt.node) end
Pause.run(S.pause, now, limits)
Latency.run(S.latency)
local session_views, sessions_retired, probes = Sessions.run(S.session, now, opt.sessions, opt.node)
local render_view = Render.run(S.render, now, opt.render)

local reaped, promoted, poisoned = 0, 0, {}
local handed_out = 0
local sites_forgotten, patterns_forgotten = 0, 0
if opt.maintain then
    reaped, promoted, poisoned = Maintain.run(now, limits, opt.max_deliveries)
    sites_forgotten = Sessions.forget(now, opt.sessions)
    patterns_forgotten = Render.forget(now, opt.render)
    if opt.revisit then handed_out = Revisit.hand_out(now, opt.revisit) end
end
local first, woke = Wake.run(now)
local ask, budget, got = begin_grant(opt, now, deadline)
Ahead.run(S.ahead, ask, budget, got, limits)
Walk.run(ask, budget, got, limits)
close_grant(got)
local seed_want = opt.seed_want
if opt.join_first and seed_want > 0
        and redis.call('SISMEMBER', K.runs .. ':members', opt.node) == 0 then
    -- seeds wait until this node is in the crawl run (it joins at start): a seed queued
    -- before the run began would not count as the run's (step/revisit.lua Revisit.seeded)
    seed_want = 0
end
local seeds, seeds_kind = Seeds.take(seed_want, deadline, opt.node)
local start_held = StartClaim.run(opt.start, opt.node, opt.lease_ms)
local released = Release.run(S.release, opt.release, opt.node)

local counts = {}
if opt.maintain or opt.count then
    counts = fleet_counts(opt.maintain)
    local idle = true
    for j = 2, #counts, 2 do idle = idle and counts[j] == 0 end
    if opt.sweep and idle then
        -- nothing left that could rediscover a page: the due ones this run did not see go
        -- now (the next step leases them), and the run is not over while any are left
        local swept, left
        swept, left, revisits_forgotten = Revisit.sweep(now, opt.sweep, opt.revisit_limits)
        handed_out = handed_out + swept
        if swept > 0 or left then
            counts[#counts + 1] = 'revisits'
            counts[#counts + 1] = swept + (left and 1 or 0)
        end
    end
    if opt.seen and opt.seen.mode == 'bloom' then -- how full it is (lib/seen.lua counts)
        counts[#counts + 1] = 'seen'
        counts[#counts + 1] = tonumber(redis.call('GET', K.dupefilter .. ':n') or 0)
    end
end
-- when the next throttled site may go, so an idle node need not poll blindly
local next_wake = first
if S.pause.n > 0 or woke or got.throttled_changed then
    next_wake = redis.call('ZRANGE', K.throttled, 0, 0, 'WITHSCORES')
end
local wait_ms = false
if next_wake[2] then wait_ms = math.max(0, tonumber(next_wake[2]) - now) end
return {'added', added, 'duplicates', dupes, 'offsite', offsite, 'duplicate_at', dupe_list,
        'rediscovered', rediscovered, 'still_linked', still, 'stale', stale,
        'reaped', reaped, 'promoted', promoted, 'poisoned', poisoned, 'handed_out', handed_out,
        'revisits_capped', revisits_capped, 'revisits_forgotten', revisits_forgotten,
        'permits_fixed', permits_fixed, 'permits_held', permits_held,
        'leased', got.leased, 'permits', got.permits, 'shares', got.shares,
        'rejoined', got.rejoined and 1 or 0, 'seeds', seeds, 'seeds_kind', seeds_kind,
        'start_held', start_held, 'counts', counts, 'wait_ms', wait_ms, 'now', now,
        'replayed', 0, 'sessions', session_views, 'retired', sessions_retired,
        'probes', probes, 'sites_forgotten', sites_forgotten, 'render', render_view,
        'patterns_forgotten', patterns_forgotten, 'released', released}
