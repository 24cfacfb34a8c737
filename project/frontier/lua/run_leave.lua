--[[
  A node leaves the fleet's crawl run with its counters (project/runs/tracker.py). The run
  ends when its last node leaves with the crawl's work done: that node gets every node's
  counters and writes the report. Nodes whose presence expired (killed; the monitor's
  alive set, when the fleet has one) no longer count as in the run.

  Input:
    KEYS[1]  runs        the current run (run_join.lua); "<runs>:seeds" the fingerprints of
                         the seeds queued in it (step/enqueue.lua), which go with it
    KEYS[2]  alive       node id, scored by when its presence expires (the monitor's)
    KEYS[3]  queued      requests queued over all sites
    KEYS[4]  delayed     retries waiting
    KEYS[5]  inflight    leases
    KEYS[6]  start_urls  seeds
    KEYS[7]  start       the claim on start()
    ARGV[1]  the node's id
    ARGV[2]  the run it leaves
    ARGV[3]  its counters for that run, JSON
  Output: {'final', started ms, ended ms, fresh (1: the seen-set was empty when it began),
          node, counters, ...} when this node ended the run;
          {'left', nodes still in it, work left (0/1)} when others are still in it or work
          is left; {'other'} when the run is no longer current (another node ended it).
          Leaving again is harmless: a node whose run could not end yet asks again
]]
--@include lib/time.lua
--@include lib/crawl.lua

local now = now_ms()
local members, stats, seeds = K.runs .. ':members', K.runs .. ':stats', K.runs .. ':seeds'
if redis.call('HGET', K.runs, 'id') ~= ARGV[2] then return {'other'} end
redis.call('HSET', stats, ARGV[1], ARGV[3])
redis.call('SREM', members, ARGV[1])
if redis.call('ZCARD', K.alive) > 0 then
    for _, node in ipairs(redis.call('SMEMBERS', members)) do
        local until_ms = tonumber(redis.call('ZSCORE', K.alive, node))
        if not until_ms or until_ms < now then redis.call('SREM', members, node) end
    end
end
local busy = (work_left() > 0 or start_running() == 1) and 1 or 0
local others = redis.call('SCARD', members)
if others > 0 or busy == 1 then return {'left', others, busy} end
local out = {'final', redis.call('HGET', K.runs, 'started'), string.format('%.0f', now),
             redis.call('HGET', K.runs, 'fresh') or '0'}
for _, v in ipairs(redis.call('HGETALL', stats)) do out[#out + 1] = v end
redis.call('DEL', K.runs, members, stats, seeds)
redis.call('HSET', K.runs, 'idle_since', string.format('%.0f', now))
return out
