--[[
  Claim the spider's start() for the fleet: one node per crawl runs it, the
  others wait for it to be done, so start_urls and start() seed a crawl once
  however many nodes start it. The claim expires unless its node extends it
  (step/start.lua), so a node that dies mid-start() hands it to a waiting node.

  Input:
    KEYS[1] start       'run\n<node>' while a node runs start(), 'done' once it ran
    KEYS[2] queued      requests queued over all sites
    KEYS[3] delayed     retries waiting for their time
    KEYS[4] inflight    leases
    KEYS[5] start_urls  seeds pushed with `redis-cli lpush`
    ARGV[1] options, one JSON object:
              node       this node's id
              lease_ms   how long the claim lasts without being extended
              new_crawl  true: a crawl that ran start() and has nothing left is over, so
                         its start() may run again (a node starting a new crawl)
  Output: 'claimed' (run start() now), 'running' (another node runs it) or 'done'
]]
--@include lib/crawl.lua

local opt = cjson.decode(ARGV[1])
local held = redis.call('GET', K.start)
local function claim()
    redis.call('SET', K.start, CODE.start_extend .. '\n' .. opt.node, 'PX', opt.lease_ms)
    return 'claimed'
end
if not held then return claim() end
if held ~= CODE.start_end then return 'running' end
if not opt.new_crawl then return 'done' end
if work_left() == 0 then return claim() end
return 'done'
