--[[
  `fleetcrawl failures retry`, one chunk: the first `taken` records of a work
  list (the dead letters, moved there whole with RENAME so no other client sees
  them twice) leave it; those with a request go back to their sites' queues,
  the others (invalid seeds) back to the dead letters.

  Input:
    KEYS[1] work       the dead letters being retried
    KEYS[2] dead       dead letters
    KEYS[3] queue      ready sites
    KEYS[4] throttled  sites that must wait
    KEYS[5] seq        arrival counter
    KEYS[6] queued     requests queued over all sites
    KEYS[7] capped     sites at their concurrency cap
    ARGV[1] taken: records read from the head of the work list
    ARGV[2] requests: how many pairs follow
    ARGV[3..] pairs: site, payload; then the records that stay dead letters
  Output: how many requests were queued
]]
--@include lib/chunked.lua
--@include lib/site_queues.lua

local taken, n = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('LTRIM', K.work, taken, -1)
local items = {}
for j = 0, n - 1 do
    items[#items + 1] = {ARGV[3 + j * 2], ARGV[4 + j * 2]}
end
push_payloads(items)
local keep = {}
for j = 3 + n * 2, #ARGV do keep[#keep + 1] = ARGV[j] end
if #keep > 0 then chunked('RPUSH', K.dead, keep) end
return #items
