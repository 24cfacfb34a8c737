--[[
  Phase 10, start: the claim of the one node that runs the spider's start() for
  the whole fleet (start.lua takes it). Its node extends it with its heartbeats
  while start() runs, and ends it ('done') in the round trip that enqueues the
  last requests start() yielded (phase 1 runs first), so the fleet never sees
  an empty frontier between the two.

  Keys: start.
  ARGV section: none.
  Options used: node, lease_ms, start ('run' or 'done'; absent: nothing to do)
  Returns: 1 if the node holds the claim it asked about, else 0
]]
local function start_claim(action, node, lease_ms)
    if not action then return 0 end
    local held = redis.call('GET', K.start)
    -- a 'done' resent after a reply that was lost: it was this node's, and it is done
    if action == 'done' and held == 'done' then return 1 end
    if held ~= 'run\n' .. node then return 0 end
    if action == 'done' then
        redis.call('SET', K.start, 'done')
    else
        redis.call('PEXPIRE', K.start, lease_ms)
    end
    return 1
end
