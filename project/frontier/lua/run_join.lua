--[[
  A node joins the fleet's crawl run (project/runs/tracker.py), which begins with the first
  node to join after the last one ended: a run is one crawl, from the first node to the end
  of the work, whatever the nodes' own start times.

  Input:
    KEYS[1]  runs        the current run: {id, started (ms), fresh}, or {idle_since (ms)}
                         between runs; "<runs>:members" the nodes in it, "<runs>:stats"
                         their counters
    KEYS[2]  dupefilter  the seen-set: empty when the run began (fresh = 1: as the first step
                         that enqueued in it, or this join, found it), the run fetches every
                         page it finds (lib/seen.lua's forms count in ':n')
    ARGV[1]  the node's id
    ARGV[2]  the id the run gets if this node begins it
    ARGV[3]  '1': the node keeps alive (FRONTIER_KEEP_ALIVE): a run it begins began when
             the last one went idle
  Output: {run id, started ms}
]]
--@include lib/time.lua
--@include lib/seen.lua

local now = now_ms()
local id = redis.call('HGET', K.runs, 'id')
if not id then
    id = ARGV[2]
    -- a keep-alive fleet's next run begins when the last one went idle: its first revisits
    -- may be handed out before any node joins
    local started = ARGV[3] == '1' and tonumber(redis.call('HGET', K.runs, 'idle_since')) or now
    redis.call('HSET', K.runs, 'id', id, 'started', string.format('%.0f', started))
    -- a step that enqueued before this join (step/enqueue.lua) already said it
    redis.call('HSETNX', K.runs, 'fresh', seen_empty() and 1 or 0)
    redis.call('HDEL', K.runs, 'idle_since')
end
redis.call('SADD', K.runs .. ':members', ARGV[1])
return {id, redis.call('HGET', K.runs, 'started')}
