-- wrk script for benchmarks/http_bench.py: POST one fixed inference request, over and over,
-- then print one JSON line that http_bench.py parses.
--
--   wrk -t2 -c16 -d5s -s benchmarks/infer.lua URL -- BODY_FILE CONTENT_TYPE [HEADER_LENGTH]
--
-- BODY_FILE holds the exact request body (a v2 JSON body, or JSON followed by raw tensor
-- bytes); HEADER_LENGTH, when given, is sent as Inference-Header-Content-Length (the binary
-- tensor extension). The body is read from a file because it may hold any byte.

function init(args)
   local file = assert(io.open(args[1], "rb"), "cannot open the body file " .. tostring(args[1]))
   wrk.body = file:read("*a")
   file:close()
   wrk.method = "POST"
   wrk.headers["Content-Type"] = args[2]
   if args[3] ~= nil and args[3] ~= "" then
      wrk.headers["Inference-Header-Content-Length"] = args[3]
   end
   -- wrk formats the request once after init: every request is the same bytes.
end

-- Runs once, in wrk's main thread, after the run. Durations and latencies are microseconds;
-- errors.status counts answers that were not 2xx or 3xx.
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
