--[[
  The seen-set (SCHEDULER_DUPEFILTER_KEY) in one of its three forms, FRONTIER_SEEN_MODE
  (project/frontier/seen.py sizes them and records the form in "<dupefilter>:conf"):

    set    the dupefilter key itself: a set of raw fingerprints (about 76 bytes a URL)
    exact  "<dupefilter>:<bucket>" for 2^b buckets: sets of 53-bit integers cut from the
           fingerprint, which Redis keeps as intsets (8 bytes a member) while a bucket holds
           at most set-max-intset-entries (512; buckets are sized for about 128-256 each).
           A false duplicate needs two fingerprints equal in 53 + b bits.
    bloom  "<dupefilter>:bloom:<part>": strings of sizes[part] bits, `k` bits set for each
           URL (enhanced double hashing) in one part, chosen in proportion to the sizes (the
           parts are sized to the allocator's classes); a false positive skips a URL.

  The forms other than `set` count what they hold in "<dupefilter>:n" (SCARD for a set).
  Keys are built from K.dupefilter, so they share its hash slot when it has a hash tag.

  seen_empty() is true while the seen-set holds nothing, in any form.
  seen_mark(fps, cfg) marks every fingerprint of `fps` as seen; returns a table of
  booleans, true where that fingerprint was seen before (or earlier in `fps`), and how
  many were new. cfg: nil or {mode = 'set'}, {mode = 'exact', buckets = 2^b},
  {mode = 'bloom', sizes = {bits of each part}, total = their sum, k = bits per URL,
  parts = #sizes}.
]]
local SEEN_MEMBER_SPAN = 2 ^ 53 -- integers below it are exact in Lua's doubles

-- The fingerprint as 20 bytes: Scrapy's are SHA-1 digests; any other length is hashed
local function fp_bytes(fp)
    if #fp ~= 20 then
        local hex = redis.sha1hex(fp)
        local raw = {}
        for i = 1, 40, 2 do raw[#raw + 1] = tonumber(string.sub(hex, i, i + 1), 16) end
        return raw
    end
    return {string.byte(fp, 1, 20)}
end

local function exact_place(fp, buckets)
    local b = fp_bytes(fp)
    local bucket = ((b[1] * 256 + b[2]) * 256 + b[3]) % buckets
    local member = b[4] % 32 -- 5 + 6 * 8 = 53 bits
    for i = 5, 10 do member = member * 256 + b[i] end
    -- a Lua number reaches Redis as %.17g: an integer below 2^53 as its digits
    return K.dupefilter .. ':' .. bucket, member % SEEN_MEMBER_SPAN
end

-- The Bloom part of `fp` and BITFIELD arguments for its k bits: `op` 'SET' (each bit to 1,
-- replying the old ones) or 'GET'
local function bloom_place(fp, cfg, op)
    local b = fp_bytes(fp)
    local h1 = ((b[1] * 256 + b[2]) * 256 + b[3]) * 256 + b[4]
    local h2 = ((b[5] * 256 + b[6]) * 256 + b[7]) * 256 + b[8]
    -- the part: 24 bits of the fingerprint spread over all the parts' bits
    local at = ((b[9] * 256 + b[10]) * 256 + b[11]) / 16777216 * cfg.total
    local part, bits = #cfg.sizes - 1, cfg.sizes[#cfg.sizes]
    for p, size in ipairs(cfg.sizes) do
        if at < size then part, bits = p - 1, size break end
        at = at - size
    end
    local args = {}
    for i = 0, cfg.k - 1 do
        -- below 2^32 * (1 + k) + k^3: exact in doubles for any k a setting allows
        args[#args + 1] = op
        args[#args + 1] = 'u1'
        args[#args + 1] = (h1 + i * h2 + (i * i * i - i) / 6) % bits
        if op == 'SET' then args[#args + 1] = 1 end
    end
    return K.dupefilter .. ':bloom:' .. part, args
end

local function all_set(bits)
    for _, bit in ipairs(bits) do if bit == 0 then return false end end
    return true
end

local function seen_mark(fps, cfg)
    local flags, new = {}, 0
    local mode = cfg and cfg.mode or 'set'
    if #fps == 0 then return flags, 0 end
    if mode == 'set' then
        local found = chunked_list('SMISMEMBER', K.dupefilter, fps)
        local in_batch, fresh = {}, {}
        for j, fp in ipairs(fps) do
            flags[j] = found[j] == 1 or in_batch[fp] == true
            if not flags[j] then
                in_batch[fp] = true
                fresh[#fresh + 1] = fp
            end
        end
        if #fresh > 0 then chunked('SADD', K.dupefilter, fresh) end
        return flags, #fresh
    end
    for j, fp in ipairs(fps) do
        if mode == 'exact' then
            local key, member = exact_place(fp, cfg.buckets)
            flags[j] = redis.call('SADD', key, member) == 0
        else
            -- SET returns each bit's old value: all of them set means seen (or a false positive)
            local key, args = bloom_place(fp, cfg, 'SET')
            flags[j] = all_set(redis.call('BITFIELD', key, unpack(args)))
        end
        if not flags[j] then new = new + 1 end
    end
    if new > 0 then redis.call('INCRBY', K.dupefilter .. ':n', new) end
    return flags, new
end

local function seen_empty()
    return redis.call('EXISTS', K.dupefilter, K.dupefilter .. ':n') == 0
end

-- Only whether each fingerprint was seen, marking nothing: {true/false, ...}
local function seen_test(fps, cfg)
    local flags = {}
    for j, fp in ipairs(fps) do
        if cfg.mode == 'exact' then
            local key, member = exact_place(fp, cfg.buckets)
            flags[j] = redis.call('SISMEMBER', key, member) == 1
        elseif cfg.mode == 'bloom' then
            local key, args = bloom_place(fp, cfg, 'GET')
            flags[j] = all_set(redis.call('BITFIELD', key, unpack(args)))
        else
            flags[j] = redis.call('SISMEMBER', K.dupefilter, fp) == 1
        end
    end
    return flags
end

-- Allocate a Bloom filter's parts at their size at once (a string grown bit by bit doubles
-- its allocation below 1 MiB, sds' greedy growth). SETBIT at a missing key's last bit makes a
-- string of exactly that size, and replicates as itself: a few bytes, where a SET of the
-- zeros would send up to 512 MiB down the link at once, past a replica's output buffer.
local function seen_prepare(cfg)
    if cfg.mode ~= 'bloom' then return end
    for p, size in ipairs(cfg.sizes) do
        local key = K.dupefilter .. ':bloom:' .. (p - 1)
        if redis.call('EXISTS', key) == 0 then redis.call('SETBIT', key, size - 1, 0) end
    end
end

-- Delete the seen-set of the form `cfg` describes (its count and its record of the form too).
local function seen_drop(cfg)
    local names = {K.dupefilter, K.dupefilter .. ':n', K.dupefilter .. ':conf'}
    if cfg.mode == 'exact' then
        for b = 0, cfg.buckets - 1 do names[#names + 1] = K.dupefilter .. ':' .. b end
    elseif cfg.mode == 'bloom' then
        for p = 0, cfg.parts - 1 do names[#names + 1] = K.dupefilter .. ':bloom:' .. p end
    end
    local deleted = 0
    for first = 1, #names, CHUNK do
        deleted = deleted + redis.call('DEL', unpack(names, first, math.min(#names, first + CHUNK - 1)))
    end
    return deleted
end
