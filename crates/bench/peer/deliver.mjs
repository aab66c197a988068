// B6's peer: graphile-worker (pinned in package.json / package-lock.json) delivering the same
// HTTP calls fitorder's outbox worker makes, as jobs on the same PostgreSQL (its own database).
//
//   node deliver.mjs add  <database-url> <requests.json>   migrate, then add one job per request
//   node deliver.mjs work <database-url> <concurrency> <local-queue-size>
//                                                          run the worker until SIGTERM/SIGINT
//
// requests.json: [{"url": "...", "headers": [["k", "v"], ...], "body": "..."}, ...], written by
// the bench from the very requests fitorder's worker sends. The bench times `work` from the
// first request reaching its no-op downstream until graphile_worker._private_jobs is empty.
import { readFileSync } from "node:fs";
import http from "node:http";
import { Logger, makeWorkerUtils, run, runMigrations } from "graphile-worker";

const [mode, connectionString, ...rest] = process.argv.slice(2);
if (!mode || !connectionString) {
  console.error("usage: node deliver.mjs add <database-url> <requests.json> | work <database-url> <concurrency> <local-queue-size>");
  process.exit(2);
}

if (mode === "add") {
  const requests = JSON.parse(readFileSync(rest[0], "utf8"));
  await runMigrations({ connectionString });
  const utils = await makeWorkerUtils({ connectionString });
  try {
    for (let i = 0; i < requests.length; i += 1000) {
      await utils.addJobs(
        requests.slice(i, i + 1000).map((payload) => ({ identifier: "deliver", payload, maxAttempts: 5 })),
      );
    }
  } finally {
    await utils.release();
  }
  console.log(`added ${requests.length} jobs`);
} else if (mode === "work") {
  const concurrency = Number(rest[0] ?? 16);
  const localQueueSize = Number(rest[1] ?? -1);
  // Keep-alive connections to the downstream, as many as jobs run at once.
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency, noDelay: true });
  // Warnings and errors only: a line per job would cost the peer more than the job.
  const logger = new Logger((scope) => (level, message) => {
    if (level === "error" || level === "warning") console.error(`[${scope.label ?? "worker"}] ${level}: ${message}`);
  });
  const post = (job) =>
    new Promise((resolve, reject) => {
      const req = http.request(job.url, { method: "POST", agent, headers: Object.fromEntries(job.headers) }, (res) => {
        res.resume();
        res.on("end", () =>
          res.statusCode >= 200 && res.statusCode < 300 ? resolve() : reject(new Error(`HTTP ${res.statusCode}`)),
        );
      });
      req.on("error", reject);
      req.end(job.body);
    });
  await run({
    connectionString,
    concurrency,
    logger,
    maxPoolSize: Math.max(10, concurrency + 2),
    pollInterval: 1000,
    noHandleSignals: false,
    taskList: { deliver: async (payload) => post(payload) },
    preset: {
      worker: {
        // The documented throughput settings: jobs fetched (and locked) in batches, and
        // completions batched (https://worker.graphile.org/docs/performance#batching).
        ...(localQueueSize > 1 ? { localQueue: { size: localQueueSize } } : {}),
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
