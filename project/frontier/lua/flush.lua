--[[
  Delete a finished crawl's frontier (SCHEDULER_PERSIST = False), only if it is still
  finished now: nothing queued, delayed, leased or seeded, and no node running start().
  A node that decided the crawl was over a moment ago must not delete a crawl that began
  since (new seeds, a node that claimed start() again). Dead letters stay.

  Input:
    KEYS[1]  queue       ready sites (empty when nothing is queued: site queues are gone)
    KEYS[2]  inflight    leases
    KEYS[3]  delayed     retries
    KEYS[4]  dupefilter  the seen-set
    KEYS[5]  seq         arrival counter
    KEYS[6]  start_urls  seeds
    KEYS[7]  throttled   sites that must wait
    KEYS[8]  limits      fleet-wide caps
    KEYS[9]  rates       adaptive rates
    KEYS[10] buckets     token buckets
    KEYS[11] active      download permits held per site (and <active>:<node> per node)
    KEYS[12] leases      leases ever granted per site
    KEYS[13] lat_sum     latency sums
    KEYS[14] lat_n       latency samples
    KEYS[15] queued      requests queued over all sites
    KEYS[16] deliveries  expired-lease counts
    KEYS[17] allowed     the crawl's sites
    KEYS[18] recent      when each site was last leased
    KEYS[19] start       the claim on start()
    KEYS[20] capped      sites at their cap
    KEYS[21] holders     nodes holding permits
    KEYS[22] revisit     what revisits need of each URL under a revisit policy
    KEYS[23] due         when those revisits are due
  Output: keys deleted, or -1 when the crawl is not over (nothing deleted)
]]
--@include lib/crawl.lua
--@include lib/chunked.lua
--@include lib/seen.lua

if work_left() > 0 or start_running() == 1 then return -1 end
local deleted = 0
local form = redis.call('GET', K.dupefilter .. ':conf')
if form then
    local ok, cfg = pcall(cjson.decode, form)
    if ok and type(cfg) == 'table' then deleted = seen_drop(cfg) end
end
for _, node in ipairs(redis.call('ZRANGE', K.holders, 0, -1)) do
    deleted = deleted + redis.call('DEL', K.active .. ':' .. node)
end
return deleted + redis.call('DEL', K.capped, K.holders, K.queue, K.inflight, K.delayed, K.dupefilter, K.seq, K.throttled,
                  K.limits, K.rates, K.buckets, K.active, K.leases, K.lat_sum, K.lat_n,
                  K.queued, K.deliveries, K.allowed, K.recent, K.start, K.revisit, K.due)
