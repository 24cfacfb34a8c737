--[[
  Phase 10, start: the claim of the one node that runs the spider's start() for
  the whole fleet (start.lua takes it). Its node extends it with its heartbeats
  while start() runs, and ends it ('done') in the round trip that enqueues the
  last requests start() yielded (phase 1 runs first), so the fleet never sees
  an empty frontier between the two.

  Keys: start.
  ARGV section: none.
  Options used: node, lease_ms, start (CODE.start_extend or CODE.start_end; absent:
                nothing to do)
  Returns: 1 if the node holds the claim it asked about, else 0
]]
local StartClaim = {}

function StartClaim.run(action, node, lease_ms)
    if not action then return 0 end
    local held = redis.call('GET', K.start)
    -- a 'done' resent after a reply that was lost: it was this node's, and it is done
    if action == CODE.start_end and held == CODE.start_end then return 1 end
    if held ~= CODE.start_extend .. '\n' .. node then return 0 end
    if action == CODE.start_end then
        redis.call('SET', K.start, CODE.start_end)
    else
        redis.call('PEXPIRE', K.start, lease_ms)
    end
    return 1
end
