--[[
  A node's heartbeat, once per MONITOR_INTERVAL: its record goes into the nodes
  hash and its presence into the alive set, scored by when it expires (Redis'
  clock: clock skew between machines does not matter). The first node whose
  heartbeat finds the leader lock free (SET NX, TTL 0.9 x interval) writes the
  fleet sample, so the history gets about one sample per interval however many
  nodes run. The sample is computed here, from Redis itself, at one instant:
  queue sizes, seen-set, dead letters, and the sums of the node records.
  Records of nodes gone for longer than the history are dropped.

  Input:
    KEYS[1]  nodes           node id -> its last record (JSON)
    KEYS[2]  alive           node id, scored by when its presence expires (ms)
    KEYS[3]  history_leader  who writes this interval's sample
    KEYS[4]  history         the fleet samples, a capped stream
    KEYS[5]  queued          requests queued over all sites
    KEYS[6]  delayed         retries waiting
    KEYS[7]  inflight        leases
    KEYS[8]  dupefilter      the seen-set
    KEYS[9]  dead            dead letters
    KEYS[10] start_urls      seeds waiting

    ARGV[1]  the node's id
    ARGV[2]  its record, JSON
    ARGV[3]  options, JSON: {presence_ms, leader_ms, history_ms, finished}; finished: the
             node is leaving (no presence, no sample)
  Output: 1 when this heartbeat wrote the fleet sample, else 0
]]
--@include lib/time.lua
--@include lib/chunked.lua
--@include lib/seeds.lua

local node, record = ARGV[1], ARGV[2]
local opt = cjson.decode(ARGV[3])
local now = now_ms()
redis.call('HSET', K.nodes, node, record)
if opt.finished then
    redis.call('ZREM', K.alive, node)
    return 0
end
redis.call('ZADD', K.alive, now + opt.presence_ms, node)
if not redis.call('SET', K.history_leader, node, 'NX', 'PX', opt.leader_ms) then
    return 0
end
local keep = opt.history_ms
local s = {
    queued = tonumber(redis.call('GET', K.queued)) or 0, delayed = redis.call('ZCARD', K.delayed),
    in_flight = redis.call('ZCARD', K.inflight), seen = math.max(redis.call('SCARD', K.dupefilter),
        tonumber(redis.call('GET', K.dupefilter .. ':n') or 0)),
    dead = redis.call('LLEN', K.dead), seeds = seed_count(),
    pages = 0, items = 0, errors = 0, retries = 0,
    pages_per_s = 0, items_per_s = 0, alive = 0, nodes = {},
}
local fields = redis.call('HGETALL', K.nodes)
local stale = {}
for i = 1, #fields, 2 do
    local id = fields[i]
    local ok, rec = pcall(cjson.decode, fields[i + 1])
    if ok and type(rec) == 'table' then
        s.pages = s.pages + (tonumber(rec.pages) or 0)
        s.items = s.items + (tonumber(rec.items) or 0)
        s.errors = s.errors + (tonumber(rec.errors) or 0)
        s.retries = s.retries + (tonumber(rec.retries) or 0)
        local expires = tonumber(redis.call('ZSCORE', K.alive, id))
        if rec.state == 'running' and expires and expires > now then
            local pps = (tonumber(rec.pages_per_min) or 0) / 60
            s.nodes[id] = pps
            s.pages_per_s = s.pages_per_s + pps
            s.items_per_s = s.items_per_s + (tonumber(rec.items_per_min) or 0) / 60
            s.alive = s.alive + 1
        elseif (tonumber(rec.last_seen) or 0) * 1000 < now - keep then
            stale[#stale + 1] = id
        end
    else
        stale[#stale + 1] = id
    end
end
if #stale > 0 then
    chunked('HDEL', K.nodes, stale)
    chunked('ZREM', K.alive, stale)
end
redis.call('XADD', K.history, 'MINID', '~', now - keep, '*', 's', cjson.encode(s))
return 1
