--[[
  Layout 5's upgrade (project/frontier/layout.py): a site of the older sorted-set layout
  that has leases joins its priority index, its requests counted as pushed.

  Input:
    KEYS[1] queue       ready sites
    KEYS[2] throttled   sites that must wait
    KEYS[3] capped      sites at their concurrency cap
    KEYS[4] seq         arrival counter
    KEYS[5] queued      requests queued over all sites
    ARGV[1]   the site
  Output: the score of the site's best older request, or nil when it has none
]]
--@include lib/chunked.lua
--@include lib/site_queues.lua

return sq.adopt_older(ARGV[1])
