-- wrk script for benchmarks/bench_peers.py: POST one v2 inference body to a model picked per
-- request, uniformly or Zipf-skewed over the models, then print one JSON line to parse.
--
--   wrk -t2 -c16 -d5s -s benchmarks/peers.lua URL -- BODY_FILE MODELS_FILE uniform|zipf PATH_FORMAT
--
-- MODELS_FILE lists one model name a line; PATH_FORMAT is the inference path with %s for the
-- model (the v2 path, /v2/models/%s/infer, for every peer so far). Zipf uses exponent 1: the
-- model of rank k is asked k times less often than the first.

local names = {}
local cumulative = {}

function init(args)
   local file = assert(io.open(args[1], "rb"), "cannot open the body file " .. tostring(args[1]))
   wrk.body = file:read("*a")
   file:close()
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   for line in io.lines(args[2]) do
      if line ~= "" then
         names[#names + 1] = line
      end
   end
   assert(#names > 0, "no model names in " .. tostring(args[2]))
   local total = 0
   for rank = 1, #names do
      total = total + ((args[3] == "zipf") and (1 / rank) or 1)
      cumulative[rank] = total
   end
   for rank = 1, #names do
      cumulative[rank] = cumulative[rank] / total
   end
   path_format = args[4]
   math.randomseed(os.time() + math.floor(os.clock() * 1000000))
end

local function pick()
   local u = math.random()
   local low, high = 1, #cumulative
   while low < high do
      local middle = math.floor((low + high) / 2)
      if cumulative[middle] < u then
         low = middle + 1
      else
         high = middle
      end
   end
   return names[low]
end

function request()
   return wrk.format(nil, string.format(path_format, pick()))
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format(
      'CORRAL_WRK_RESULT {"duration_us":%d,"requests":%d,"bytes":%d,'
         .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
         .. '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
      summary.duration, summary.requests, summary.bytes,
      errors.connect, errors.read, errors.write, errors.status, errors.timeout,
      latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max))
end
