--[[
  A node joins the fleet's crawl run (project/runs/tracker.py), which begins with the first
  node to join after the last one ended: a run is one crawl, from the first node to the end
  of the work, whatever the nodes' own start times.

  Input:
    KEYS[1]  runs        the current run: {id, started (ms), fresh}, or {idle_since (ms)}
                         between runs ('seen_began': a step marked the first URL of an empty
                         seen-set before any node joined, step/enqueue.lua); "<runs>:members"
                         the nodes in it, "<runs>:stats" their counters, "<runs>:seeds" the
                         seeds it queued
    KEYS[2]  dupefilter  the seen-set: empty when the run began (fresh = 1), the run fetches
                         every page it finds (lib/seen.lua's forms count in ':n')
    KEYS[3]  alive       node id, scored by when its presence expires (the monitor's)
    KEYS[4]  queued      requests queued over all sites
    KEYS[5]  delayed     retries waiting
    KEYS[6]  inflight    leases
    KEYS[7]  start_urls  seeds
    KEYS[8]  start       the claim on start()
    ARGV[1]  the node's id
    ARGV[2]  the id the run gets if this node begins it
    ARGV[3]  '1': the node keeps alive (FRONTIER_KEEP_ALIVE): a run it begins began when
             the last one went idle
  A current run with no work left whose nodes are all gone (their presence expired: killed
  before they could leave; only when the fleet has an alive set) is over: a new one begins,
  and the old one gets no report.
  Output: {run id, started ms}
]]
--@include lib/time.lua
--@include lib/seen.lua
--@include lib/crawl.lua

local now = now_ms()
local members = K.runs .. ':members'
local id = redis.call('HGET', K.runs, 'id')
if id and redis.call('ZCARD', K.alive) > 0 and work_left() == 0 and start_running() == 0 then
    local live = false
    for _, node in ipairs(redis.call('SMEMBERS', members)) do
        local until_ms = tonumber(redis.call('ZSCORE', K.alive, node))
        if until_ms and until_ms >= now then
            live = true
            break
        end
    end
    if not live then
        redis.call('DEL', K.runs, members, K.runs .. ':stats')
        id = nil
    end
end
if not id then
    id = ARGV[2]
    -- a keep-alive fleet's next run begins when the last one went idle: its first revisits
    -- may be handed out before any node joins
    local started = ARGV[3] == '1' and tonumber(redis.call('HGET', K.runs, 'idle_since')) or now
    local fresh = seen_empty() or redis.call('HGET', K.runs, 'seen_began') == '1'
    redis.call('HSET', K.runs, 'id', id, 'started', string.format('%.0f', started),
               'fresh', fresh and 1 or 0)
    redis.call('HDEL', K.runs, 'idle_since', 'seen_began')
    redis.call('DEL', K.runs .. ':seeds')
end
redis.call('SADD', members, ARGV[1])
return {id, redis.call('HGET', K.runs, 'started')}
