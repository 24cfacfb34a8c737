--[[
  `fleetcrawl failures retry`: dead letters go back to their sites' queues. A
  record that another client removed meanwhile is skipped, so a request is
  never queued twice.

  Input:
    KEYS[1] dead       dead letters
    KEYS[2] queue      ready sites
    KEYS[3] throttled  sites that must wait
    KEYS[4] seq        arrival counter
    KEYS[5] queued     requests queued over all sites
    ARGV    triples: the dead record as stored, the site, the payload to queue
  Output: how many were queued
]]
--@include lib/chunked.lua
--@include lib/site_queues.lua

local items = {}
for j = 1, #ARGV, 3 do
    if redis.call('LREM', K.dead, 1, ARGV[j]) == 1 then
        items[#items + 1] = {ARGV[j + 1], ARGV[j + 2]}
    end
end
push_payloads(items)
return #items
