--[[
  Give back leases a node holds but never started (a clean shutdown), so other
  nodes can take them at once instead of after their deadline.

  Input:
    KEYS[1] inflight    leases, scored by deadline
    KEYS[2] active      site -> leases in flight
    KEYS[3] queue       ready sites
    KEYS[4] throttled   sites that must wait
    KEYS[5] seq         arrival counter
    KEYS[6] queued      requests queued over all sites
    KEYS[7] start_urls  seeds list: leased seeds go back here
    ARGV[1..] in-flight members of this node
  Output: how many went back (members no longer held are skipped)
]]
--@include lib/chunked.lua
--@include lib/site_queues.lua
--@include lib/leases.lua

local held = {}
for _, m in ipairs(ARGV) do
    if redis.call('ZREM', K.inflight, m) == 1 then held[#held + 1] = m end
end
if #held == 0 then return 0 end
return requeue(held)
