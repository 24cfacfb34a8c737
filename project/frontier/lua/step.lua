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
    KEYS[10] rates       site -> adaptive rate (FLEET_AUTOTHROTTLE_ENABLED)
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

    ARGV[1]  options, one JSON object:
               node       this node's id (no newline)
               lease_ms   how long a lease lasts without a heartbeat
               want       requests to lease in all; slots: of them, at most this many
                          with a new download permit (the rest go "ahead", see
                          step/lease.lua); seed_want: seeds to take
               maintain   true: run phase 6 and return the counts
               count      true: return the counts without maintenance (an idle node
                          looking for the end of the crawl)
               max_deliveries  an entry whose lease expired this often is a dead letter
               limits     {rate, concurrency, burst_seconds, adaptive,
                           target_concurrency, min_rate, start_rate}: the defaults for
                           every site without an entry in `limits`
               counts     {enqueue, ack, retry, dead, heartbeat, pause, latency}: entries
                           in each ARGV section
               list_dupes true: return where the duplicates are in the batch (DUPEFILTER_DEBUG)
               runs       true: the fleet keeps crawl runs; a seed is queued once in each
                          (step/enqueue.lua)
               start      'run': extend this node's claim on start(); 'done': its start()
                           is over and its requests are in (this step enqueues the last)
    ARGV[2..] the sections, in the order of `counts`; each phase file describes its own

  Output: {added, duplicates, leased {site, payload, score, ...}, seeds {raw, ...},
           reaped, promoted, counts {queued, delayed, inflight, seeds, starting} or {} when
           neither maintain nor count (starting: 1 while a node runs start()),
           milliseconds until the next throttled site may go, or false,
           poisoned {dead-letter record, ...}, stale settlements, offsite requests dropped,
           1 if this node still holds the start claim it asked to extend or end, else 0,
           {batch position of a duplicate, ...} when list_dupes,
           'S' when the seeds came from a list, 'T' from a set (their in-flight members),
           permits granted {site, n, ...}, for each site of the ahead section this node's
           share of its cap (0: no cap) and its spare permits that went back
           {site, share, back, ...}},
           revisits queued: {rediscovered and due, handed out by maintenance},
           {record, ...} of URLs rediscovered before their revisit is due,
           1 if this node was no permit holder any more (its first step, or it stalled past
           its deadline and its permits went back to the fleet), else 0
]]
--@include lib/time.lua
--@include lib/chunked.lua
--@include lib/site_queues.lua
--@include lib/leases.lua
--@include lib/permits.lua
--@include lib/crawl.lua
--@include lib/seen.lua
--@include step/revisit.lua
--@include step/enqueue.lua
--@include step/settle.lua
--@include step/heartbeat.lua
--@include step/permits.lua
--@include step/pause.lua
--@include step/latency.lua
--@include step/lease.lua
--@include step/maintain.lua
--@include step/wake.lua
--@include step/seeds.lua
--@include step/start.lua

local opt = cjson.decode(ARGV[1])
local n, limits = opt.counts, opt.limits
local now = now_ms()
local deadline = now + opt.lease_ms
local at = 2 -- ARGV[1] is the options; the sections start after it

local added, dupes, offsite, dupe_list, rediscovered, still = enqueue(at, n.enqueue, opt, now)
at = at + n.enqueue * ENQUEUE_WIDTH
local stale = settle(at, n.ack, n.retry, n.dead, now)
at = at + n.ack * ACK_WIDTH + n.retry * RETRY_WIDTH + n.dead * DEAD_WIDTH
record_revisits(at, n.revisit or 0, now)
at = at + (n.revisit or 0) * REVISIT_WIDTH
heartbeat(at, n.heartbeat, deadline)
at = at + n.heartbeat * HEARTBEAT_WIDTH
permits_back(at, n.give_back, opt.node)
at = at + n.give_back * GIVE_BACK_WIDTH
pause(at, n.pause, now, limits)
at = at + n.pause * PAUSE_WIDTH
latency(at, n.latency)
at = at + n.latency * LATENCY_WIDTH

local reaped, promoted, poisoned = 0, 0, {}
local handed_out = 0
if opt.maintain then
    reaped, promoted, poisoned = maintain(now, limits, opt.max_deliveries)
    if opt.revisit then handed_out = revisits_due(now, opt.revisit) end
end
local first, woke = wake(now)
local leased, permits, parked, shares, rejoined = lease(at, n.ahead, opt, now, deadline, limits)
local seeds, seeds_kind = take_seeds(opt.seed_want, deadline, opt.node)
local start_held = start_claim(opt.start, opt.node, opt.lease_ms)

local counts = {}
if opt.maintain or opt.count then
    counts = {tonumber(redis.call('GET', K.queued) or 0), redis.call('ZCARD', K.delayed),
              redis.call('ZCARD', K.inflight), seed_count(), start_running()}
end
-- when the next throttled site may go, so an idle node need not poll blindly
local next_wake = first
if n.pause > 0 or woke or parked then
    next_wake = redis.call('ZRANGE', K.throttled, 0, 0, 'WITHSCORES')
end
local wait_ms = false
if next_wake[2] then wait_ms = math.max(0, tonumber(next_wake[2]) - now) end
return {added, dupes, leased, seeds, reaped, promoted, counts, wait_ms, poisoned, stale, offsite,
        start_held, dupe_list, seeds_kind, permits, shares, {rediscovered, handed_out}, still,
        rejoined and 1 or 0}
