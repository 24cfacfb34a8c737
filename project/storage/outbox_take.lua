--[[
  The outbox's drainer (project/storage/outbox.py) takes or renews its lease and removes the
  records it wrote to MongoDB from the head: one drainer at a time, so two nodes never remove
  what only one of them wrote. A drainer whose lease lapsed (held by another, or by nobody)
  removes nothing; whoever holds it next writes those records again, which stores them once.

  Input:
    KEYS[1]  outbox  records waiting, oldest first; "<outbox>:bytes" their size,
                     "<outbox>:drainer" the drainer's token (its lease)
    ARGV[1]  the drainer's token
    ARGV[2]  lease milliseconds from now
    ARGV[3]  records written, to remove from the head (0: take or renew the lease only)
    ARGV[4]  '1': give the lease up afterwards
  Output: {1 done or 0 another drainer holds the lease, entries left, bytes left}
]]

local bytes_key, lease_key = K.outbox .. ':bytes', K.outbox .. ':drainer'
local holder = redis.call('GET', lease_key)
local count = tonumber(ARGV[3])
-- removing needs the lease held by this drainer: a lapsed one may have gone to another that
-- wrote and removed these, so the head is now records nobody wrote
if (holder and holder ~= ARGV[1]) or (count > 0 and holder ~= ARGV[1]) then
    return {0, redis.call('LLEN', K.outbox), tonumber(redis.call('GET', bytes_key) or '0')}
end
if count > 0 then
    local size = 0
    for i = 0, count - 1 do -- one at a time: the entries may be large
        local entry = redis.call('LINDEX', K.outbox, i)
        if not entry then break end
        size = size + #entry
    end
    redis.call('LTRIM', K.outbox, count, -1)
    if redis.call('DECRBY', bytes_key, size) <= 0 or redis.call('LLEN', K.outbox) == 0 then
        redis.call('DEL', bytes_key)
    end
end
if ARGV[4] == '1' then
    redis.call('DEL', lease_key)
else
    redis.call('SET', lease_key, ARGV[1], 'PX', tonumber(ARGV[2]))
end
return {1, redis.call('LLEN', K.outbox), tonumber(redis.call('GET', bytes_key) or '0')}
