--[[
  Mark fingerprints as seen in the seen-set's form (lib/seen.lua), outside a crawl's step:
  `fleetcrawl seen migrate` moves a set into another form with it, and the seen-set
  benchmark (python -m tests.benchmarks.seen) measures each form through it.

  Input:
    KEYS[1]  dupefilter  the seen-set (SCHEDULER_DUPEFILTER_KEY)
    ARGV[1]  the form, JSON (lib/seen.lua's cfg), and what to do: {"do": "mark"} (the
             default) marks them, "test" only looks, "prepare" allocates a Bloom filter
    ARGV[2..] raw fingerprints
  Output: mark: how many of them were new; test: how many were seen; prepare: 0
]]
--@include lib/chunked.lua
--@include lib/seen.lua

local cfg = cjson.decode(ARGV[1])
local fps = {}
for i = 2, #ARGV do fps[#fps + 1] = ARGV[i] end
if cfg['do'] == 'prepare' then
    seen_prepare(cfg)
    return 0
elseif cfg['do'] == 'test' then
    local seen = 0
    for _, flag in ipairs(seen_test(fps, cfg)) do if flag then seen = seen + 1 end end
    return seen
end
local _, new = seen_mark(fps, cfg)
return new
