--[[
  Phase 2, settle: leases this node is done with leave the in-flight set, as an
  acknowledgement, a retry for later or a dead letter. Only members still held
  count off their site's active leases (a lease reaped meanwhile was counted
  when it was reaped).

  Keys: inflight, delayed, dead, active.
  ARGV sections, one after the other:
    acks     ACK_WIDTH values each:    member
    retries  RETRY_WIDTH values each:  member, delay_ms, site, payload
             (delayed member "<site>\n<payload>", due at now + delay_ms)
    dead     DEAD_WIDTH values each:   member, record (JSON, see the scheduler)
  Returns: nothing
]]
local ACK_WIDTH, RETRY_WIDTH, DEAD_WIDTH = 1, 4, 2

local function settle(at, n_ack, n_retry, n_dead, now)
    local done = {}
    for e = 0, n_ack - 1 do done[#done + 1] = ARGV[at + e] end
    at = at + n_ack * ACK_WIDTH
    if n_retry > 0 then
        local zargs = {}
        for e = 0, n_retry - 1 do
            local i = at + e * RETRY_WIDTH
            done[#done + 1] = ARGV[i]
            zargs[#zargs + 1] = now + tonumber(ARGV[i + 1])
            zargs[#zargs + 1] = ARGV[i + 2] .. '\n' .. ARGV[i + 3]
        end
        chunked('ZADD', K.delayed, zargs, 2)
        at = at + n_retry * RETRY_WIDTH
    end
    if n_dead > 0 then
        local records = {}
        for e = 0, n_dead - 1 do
            done[#done + 1] = ARGV[at + e * DEAD_WIDTH]
            records[#records + 1] = ARGV[at + e * DEAD_WIDTH + 1]
        end
        chunked('LPUSH', K.dead, records)
    end
    if #done == 0 then return end
    local held = {}
    local scores = chunked_list('ZMSCORE', K.inflight, done)
    for j, m in ipairs(done) do
        if scores[j] then held[#held + 1] = m end
    end
    if #held > 0 then
        chunked('ZREM', K.inflight, held)
        release_active(held)
    end
end
