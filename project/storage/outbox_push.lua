--[[
  A node whose MongoDB is away puts a batch of records in the fleet's outbox
  (project/storage/outbox.py): any node whose MongoDB answers, or `fleetcrawl store drain`,
  writes them there. Redis keeps them as it keeps the frontier, so a node's disk is not where
  an item waits.

  Input:
    KEYS[1]  outbox  records waiting, oldest first, one JSON record an entry; "<outbox>:bytes"
                     their size
    ARGV[1]  most bytes the outbox holds (MONGO_OUTBOX_MAX_BYTES)
    ARGV[2..n] the records
  A batch that does not fit is refused whole: the node keeps it in its journal. Run twice (a
  client's retry), a batch is queued twice; writing a record twice stores it once (the
  writes are upserts by _id, and content only moves forward by last_seen).
  Output: {1 taken or 0 refused, entries in the outbox, bytes in the outbox}
]]

local bytes_key = K.outbox .. ':bytes'
local held = tonumber(redis.call('GET', bytes_key) or '0')
local size = 0
for i = 2, #ARGV do
    size = size + #ARGV[i]
end
if held + size > tonumber(ARGV[1]) then
    return {0, redis.call('LLEN', K.outbox), held}
end
-- chunked: Lua's stack takes a few thousand values
local count = 0
for first = 2, #ARGV, 1000 do
    count = redis.call('RPUSH', K.outbox, unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
return {1, count, redis.call('INCRBY', bytes_key, size)}
