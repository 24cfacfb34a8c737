--[[
  Mark fingerprints as seen in the seen-set's form (lib/seen.lua), outside a crawl's step:
  `fleetcrawl seen migrate` moves a set into another form with it, and the seen-set
  benchmark (python -m tests.benchmarks.seen) measures each form through it.

  Input:
    KEYS[1]  dupefilter  the seen-set (SCHEDULER_DUPEFILTER_KEY)
    ARGV[1]  the form, JSON (lib/seen.lua's cfg)
    ARGV[2..] raw fingerprints
  Output: how many of them were new
]]
--@include lib/chunked.lua
--@include lib/seen.lua

local fps = {}
for i = 2, #ARGV do fps[#fps + 1] = ARGV[i] end
local _, new = seen_mark(fps, cjson.decode(ARGV[1]))
return new
