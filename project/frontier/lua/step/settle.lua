--[[
  Phase 2, settle: leases this node is done with leave the in-flight set, as an
  acknowledgement, a retry for later or a dead letter. Only a lease the node
  still holds settles: one reaped meanwhile belongs to whichever node took it
  next, so its retry or dead letter from here is dropped (it would fork the
  request into two live copies) and counted as stale.

  Keys: inflight, delayed, dead, deliveries.
  ARGV sections, one after the other:
    acks     ACK_WIDTH values each:    member
    retries  RETRY_WIDTH values each:  member, delay_ms, site, payload
             (delayed member "<site>\n<payload>", due at now + delay_ms)
    dead     DEAD_WIDTH values each:   member, record (JSON, see project/frontier/loop.py)
  Returns: how many settlements were stale
]]
local ACK_WIDTH, RETRY_WIDTH, DEAD_WIDTH = 1, 4, 2

-- Which of these members the in-flight set still holds.
local function held_set(members)
    local held = {}
    if #members == 0 then return held end
    local scores = chunked_list('ZMSCORE', K.inflight, members)
    for j, m in ipairs(members) do
        if scores[j] then held[m] = true end
    end
    return held
end

local function settle(at, n_ack, n_retry, n_dead, now)
    local done = {}
    for e = 0, n_ack + n_retry + n_dead - 1 do
        local i
        if e < n_ack then i = at + e
        elseif e < n_ack + n_retry then i = at + n_ack + (e - n_ack) * RETRY_WIDTH
        else i = at + n_ack + n_retry * RETRY_WIDTH + (e - n_ack - n_retry) * DEAD_WIDTH end
        done[#done + 1] = ARGV[i]
    end
    local held = held_set(done)
    local stale = 0
    local zargs, records, leaving = {}, {}, {}
    for e, m in ipairs(done) do
        if held[m] then
            held[m] = nil -- a member named twice settles once
            leaving[#leaving + 1] = m
            if e > n_ack and e <= n_ack + n_retry then
                local i = at + n_ack + (e - 1 - n_ack) * RETRY_WIDTH
                zargs[#zargs + 1] = now + tonumber(ARGV[i + 1])
                zargs[#zargs + 1] = ARGV[i + 2] .. '\n' .. ARGV[i + 3]
            elseif e > n_ack + n_retry then
                records[#records + 1] = ARGV[at + n_ack + n_retry * RETRY_WIDTH
                    + (e - 1 - n_ack - n_retry) * DEAD_WIDTH + 1]
            end
        elseif e > n_ack then
            stale = stale + 1
        end
    end
    if #zargs > 0 then chunked('ZADD', K.delayed, zargs, 2) end
    if #records > 0 then chunked('LPUSH', K.dead, records) end
    if #leaving > 0 then
        chunked('ZREM', K.inflight, leaving)
        if redis.call('EXISTS', K.deliveries) == 1 then
            -- entries that were reaped before, and have now come to an end
            local ids = {}
            for _, m in ipairs(leaving) do
                ids[#ids + 1] = redis.sha1hex(string.sub(m, string.find(m, '\n', 1, true) + 1))
            end
            chunked('HDEL', K.deliveries, ids)
        end
    end
    return stale
end
