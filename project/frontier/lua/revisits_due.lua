--[[
  Revisits due by now, by Redis' clock (fleetcrawl status).

  Input:
    KEYS[1] due         fingerprint, scored by when its URL may be fetched again (ms)
  Output: how many are due
]]
--@include lib/time.lua

return redis.call('ZCOUNT', K.due, '-inf', now_ms())
