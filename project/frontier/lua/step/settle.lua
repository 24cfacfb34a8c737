--[[
  Phase 2, settle: leases this node is done with leave the in-flight set, as an
  acknowledgement, a retry for later or a dead letter. Only a lease the node
  still holds settles: one reaped meanwhile belongs to whichever node took it
  next, so its retry or dead letter from here is dropped (it would fork the
  request into two live copies) and counted as stale.

  Keys: inflight, delayed, dead, deliveries.
  ARGV section ack: member
  ARGV section retry: member delay_ms site payload
    (the delayed member is "<site>\n<payload>", due at now + delay_ms)
  ARGV section dead: member record
    (record: JSON, see project/frontier/rejects.py)
  Returns: how many settlements were stale
]]
local Settle = {}

do
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

    -- The members of a section's entries, in order, each with its section and ARGV index.
    local function members_of(sec, done)
        for e = 0, sec.n - 1 do
            local i = sec.at + e * sec.width
            done[#done + 1] = {ARGV[i + sec.member], sec, i}
        end
    end

    function Settle.run(acks, retries, dead, now)
        local done = {}
        members_of(acks, done)
        members_of(retries, done)
        members_of(dead, done)
        local names = {}
        for j, entry in ipairs(done) do names[j] = entry[1] end
        local held = held_set(names)
        local stale = 0
        local zargs, records, leaving = {}, {}, {}
        for _, entry in ipairs(done) do
            local m, sec, i = entry[1], entry[2], entry[3]
            if held[m] then
                held[m] = nil -- a member named twice settles once
                leaving[#leaving + 1] = m
                if sec == retries then
                    zargs[#zargs + 1] = now + tonumber(ARGV[i + sec.delay_ms])
                    zargs[#zargs + 1] = ARGV[i + sec.site] .. '\n' .. ARGV[i + sec.payload]
                elseif sec == dead then
                    records[#records + 1] = ARGV[i + sec.record]
                end
            elseif sec ~= acks then
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
end
