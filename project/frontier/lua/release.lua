--[[
  A node shuts down cleanly with nothing left to settle (else the step that settles does
  this, step/release.lua): the leases it holds but never started go back to
  the queue, and its download permits to the fleet, so other nodes can take
  them at once instead of after their deadline.

  Input:
    KEYS[1] inflight    leases, scored by deadline
    KEYS[2] active      site -> download permits held
    KEYS[3] queue       ready sites
    KEYS[4] throttled   sites that must wait
    KEYS[5] seq         arrival counter
    KEYS[6] queued      requests queued over all sites
    KEYS[7] start_urls  seeds list: leased seeds go back here
    KEYS[8] capped      sites at their concurrency cap
    KEYS[9] holders     nodes holding permits
    ARGV[1]   the node
    ARGV[2..] in-flight members of this node
  Output: how many leases went back (members no longer held are skipped)
]]
--@include lib/chunked.lua
--@include lib/site_queues.lua
--@include lib/leases.lua
--@include lib/permits.lua
--@include step/release.lua

-- ARGV[2..] laid out as the step's release section: the same phase, on its own
return Release.run({at = 2, n = #ARGV - 1, width = 1, member = 0}, true, ARGV[1])
