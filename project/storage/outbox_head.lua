--[[
  The oldest records of the outbox (project/storage/outbox.py), left in place: at most
  ARGV[1] of them and about ARGV[2] bytes (always the first), so a drainer reads a bounded
  batch whatever the records weigh. An entry over ARGV[3] bytes (pushed by hand: the store's
  records are at most a BSON document) comes back as a short stub that is no record, and the
  drainer sets the stub aside and removes the entry as it removes any other.

  Input:
    KEYS[1]  outbox  records waiting, oldest first
    ARGV[1]  most entries
    ARGV[2]  about the most bytes (the entry that crosses it is the last)
    ARGV[3]  most bytes of one entry read whole
  Output: the entries, oldest first
]]

local most, budget, entry_most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local entries, size = {}, 0
for i = 0, most - 1 do
    local entry = redis.call('LINDEX', K.outbox, i)
    if not entry then break end
    if #entry > entry_most then
        entry = string.format('{"oversized":%d,"head":%q}', #entry, string.sub(entry, 1, 200))
    end
    entries[#entries + 1] = entry
    size = size + #entry
    if size >= budget then break end
end
return entries
