--[[
  Seeds waiting for one spider (fleetcrawl status): its list or set of seeds, counted.

  Input:
    KEYS[1] start_urls  seeds pushed with `redis-cli lpush` (or `sadd`)
  Output: how many
]]
--@include lib/seeds.lua

return seed_count()
