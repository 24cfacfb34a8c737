"""Lua scripts of the shared frontier: each call is one atomic round trip."""

from __future__ import annotations

__all__ = ["RELEASE", "STEP"]

# A member of the in-flight set is "<node>\n<kind><payload>", kind "R" for a
# request (JSON payload) and "S" for a raw seed taken from start_urls.
# Scores: queue = -priority * 1e10 + seq (priority first, then FIFO);
# in-flight = lease deadline in ms; delayed = not-before time in ms.
_COMMON = r"""
local function requeue_score(payload, seq)
    local ok, doc = pcall(cjson.decode, payload)
    local priority = 0
    if ok and type(doc) == 'table' and type(doc['priority']) == 'number' then
        priority = doc['priority']
    end
    if priority > 100000 then priority = 100000 end
    if priority < -100000 then priority = -100000 end
    return -priority * 1e10 + seq
end

-- Put in-flight members (node prefix stripped) back where they came from.
local function requeue(members, k_queue, k_seq, k_seeds)
    local zargs, seeds = {}, {}
    local n = 0
    for _, m in ipairs(members) do
        local nl = string.find(m, '\n', 1, true)
        local body = string.sub(m, nl + 1)
        if string.sub(body, 1, 1) == 'S' then
            seeds[#seeds + 1] = string.sub(body, 2)
        else
            n = n + 1
            zargs[#zargs + 1] = body
        end
    end
    if n > 0 then
        local base = redis.call('INCRBY', k_seq, n) - n
        local args = {}
        for i, body in ipairs(zargs) do
            args[#args + 1] = requeue_score(string.sub(body, 2), base + i)
            args[#args + 1] = string.sub(body, 2)
        end
        redis.call('ZADD', k_queue, unpack(args))
    end
    if #seeds > 0 then
        redis.call('RPUSH', k_seeds, unpack(seeds))
    end
    return n + #seeds
end
"""

# KEYS: queue, inflight, delayed, seen, seq, seeds, dead
# ARGV: node, now_ms, deadline_ms, want, seed_want, maintain,
#       n_enqueue, n_ack, n_retry, n_dead, n_heartbeat, then per entry:
#       enqueue: mode+fingerprint, priority, payload
#       ack: member
#       retry: member, not_before_ms, payload
#       dead: member, record
#       heartbeat: member
# Returns {added, duplicates, leased{member, score...}, seeds{...},
#          reaped, promoted, counts{queue, delayed, inflight, seeds} or {}}
STEP = (
    _COMMON
    + r"""
local k_queue, k_inflight, k_delayed, k_seen, k_seq, k_seeds, k_dead =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local node, now, deadline = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want, seed_want, maintain = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local n_enq, n_ack, n_retry, n_dead, n_hb =
    tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local i = 12
local prefix = node .. '\n'

-- 1. enqueue: one SMISMEMBER + one SADD + one ZADD for the whole batch.
-- fp is 'f'..fingerprint (filter) or 'm'..fingerprint (dont_filter: only
-- mark the URL as seen).
local added, dupes = 0, 0
if n_enq > 0 then
    local fps, idx = {}, {}
    for e = 0, n_enq - 1 do
        fps[#fps + 1] = string.sub(ARGV[i + e * 3], 2)
    end
    local flags = redis.call('SMISMEMBER', k_seen, unpack(fps))
    local batch_fps, fresh, new_fps = {}, {}, {}
    for e = 0, n_enq - 1 do
        local fp = fps[e + 1]
        local filter = string.sub(ARGV[i + e * 3], 1, 1) == 'f'
        local seen = flags[e + 1] == 1 or batch_fps[fp]
        if filter and seen then
            dupes = dupes + 1
        else
            if not seen then
                batch_fps[fp] = true
                new_fps[#new_fps + 1] = fp
            end
            fresh[#fresh + 1] = e
        end
    end
    if #new_fps > 0 then redis.call('SADD', k_seen, unpack(new_fps)) end
    if #fresh > 0 then
        local base = redis.call('INCRBY', k_seq, #fresh) - #fresh
        local args = {}
        for j, e in ipairs(fresh) do
            local priority = tonumber(ARGV[i + e * 3 + 1])
            if priority > 100000 then priority = 100000 end
            if priority < -100000 then priority = -100000 end
            args[#args + 1] = -priority * 1e10 + base + j
            args[#args + 1] = ARGV[i + e * 3 + 2]
        end
        redis.call('ZADD', k_queue, unpack(args))
        added = #fresh
    end
    i = i + n_enq * 3
end

-- 2. acknowledgements, retries and dead letters leave the in-flight set
local done = {}
for e = 0, n_ack - 1 do done[#done + 1] = ARGV[i + e] end
i = i + n_ack
if n_retry > 0 then
    local zargs = {}
    for e = 0, n_retry - 1 do
        done[#done + 1] = ARGV[i + e * 3]
        zargs[#zargs + 1] = ARGV[i + e * 3 + 1]
        zargs[#zargs + 1] = ARGV[i + e * 3 + 2]
    end
    redis.call('ZADD', k_delayed, unpack(zargs))
    i = i + n_retry * 3
end
if n_dead > 0 then
    local records = {}
    for e = 0, n_dead - 1 do
        done[#done + 1] = ARGV[i + e * 2]
        records[#records + 1] = ARGV[i + e * 2 + 1]
    end
    redis.call('LPUSH', k_dead, unpack(records))
    i = i + n_dead * 2
end
if #done > 0 then redis.call('ZREM', k_inflight, unpack(done)) end

-- 3. heartbeat: extend this node's leases (XX: never resurrect a reaped one)
if n_hb > 0 then
    local args = {'XX'}
    for e = 0, n_hb - 1 do
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[i + e]
    end
    redis.call('ZADD', k_inflight, unpack(args))
    i = i + n_hb
end

-- 4. maintenance: reap expired leases of any node, promote due retries
local reaped, promoted = 0, 0
if maintain then
    local expired = redis.call('ZRANGEBYSCORE', k_inflight, '-inf', now, 'LIMIT', 0, 1000)
    if #expired > 0 then
        redis.call('ZREM', k_inflight, unpack(expired))
        reaped = requeue(expired, k_queue, k_seq, k_seeds)
    end
    local due = redis.call('ZRANGEBYSCORE', k_delayed, '-inf', now, 'LIMIT', 0, 1000)
    if #due > 0 then
        redis.call('ZREM', k_delayed, unpack(due))
        local base = redis.call('INCRBY', k_seq, #due) - #due
        local args = {}
        for j, payload in ipairs(due) do
            args[#args + 1] = requeue_score(payload, base + j)
            args[#args + 1] = payload
        end
        redis.call('ZADD', k_queue, unpack(args))
        promoted = #due
    end
end

-- 5. lease: pop the best requests and hold them under this node's name
local leased = {}
if want > 0 then
    local popped = redis.call('ZPOPMIN', k_queue, want)
    if #popped > 0 then
        local args = {}
        for j = 1, #popped, 2 do
            args[#args + 1] = deadline
            args[#args + 1] = prefix .. 'R' .. popped[j]
            leased[#leased + 1] = popped[j]
            leased[#leased + 1] = popped[j + 1]
        end
        redis.call('ZADD', k_inflight, unpack(args))
    end
end

-- 6. seeds are leased too, so a node that dies with them does not lose them
local seeds = {}
if seed_want > 0 then
    local popped = redis.call('RPOP', k_seeds, seed_want)
    if popped then
        local args = {}
        for _, raw in ipairs(popped) do
            args[#args + 1] = deadline
            args[#args + 1] = prefix .. 'S' .. raw
            seeds[#seeds + 1] = raw
        end
        redis.call('ZADD', k_inflight, unpack(args))
    end
end

local counts = {}
if maintain then
    counts = {
        redis.call('ZCARD', k_queue), redis.call('ZCARD', k_delayed),
        redis.call('ZCARD', k_inflight), redis.call('LLEN', k_seeds),
    }
end
return {added, dupes, leased, seeds, reaped, promoted, counts}
"""
)

# Give back everything a node holds (clean shutdown): KEYS as STEP's first
# three plus seq and seeds; ARGV: members.
RELEASE = (
    _COMMON
    + r"""
local k_queue, k_inflight, k_seq, k_seeds = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held = {}
for _, m in ipairs(ARGV) do
    if redis.call('ZREM', k_inflight, m) == 1 then held[#held + 1] = m end
end
if #held == 0 then return 0 end
return requeue(held, k_queue, k_seq, k_seeds)
"""
)
