// The Restate side of W1 / W10: a Node.js service endpoint with two flavours of the same
// workflows, each echoing a string input back.
//
//   step: the "activity" is a journaled side effect, ctx.run("echo", ...), executed inside the
//         workflow's own invocation (Restate's documented equivalent of an activity).
//   rpc:  the "activity" is a durable call to a separate Restate service handler (echo/echo),
//         which the server dispatches as its own invocation, like a DW or Temporal activity task.
//
// Usage: node service.cjs PORT   (NODE_PATH must reach @restatedev/restate-sdk)
"use strict";

// @restatedev/restate-sdk 1.17 calls Promise.withResolvers (Node.js >= 22); Debian's and
// this machine's Node.js is 20, so supply the three-line ES2024 method when it is missing.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve, reject;
    const promise = new this((res, rej) => { resolve = res; reject = rej; });
    return { promise, resolve, reject };
  };
}

const restate = require("@restatedev/restate-sdk");

const echo = restate.service({
  name: "echo",
  handlers: {
    echo: async (_ctx, value) => value,
  },
});

function stepWorkflow(name, steps) {
  return restate.workflow({
    name,
    handlers: {
      run: async (ctx, value) => {
        for (let i = 0; i < steps; i++) {
          const input = value;
          value = await ctx.run("echo", async () => input);
        }
        return value;
      },
    },
  });
}

function rpcWorkflow(name, steps) {
  return restate.workflow({
    name,
    handlers: {
      run: async (ctx, value) => {
        for (let i = 0; i < steps; i++) {
          value = await ctx.serviceClient(echo).echo(value);
        }
        return value;
      },
    },
  });
}

const port = Number(process.argv[2] || 9080);
restate
  .serve({
    services: [echo, stepWorkflow("w1", 1), stepWorkflow("w10", 10), rpcWorkflow("w1rpc", 1), rpcWorkflow("w10rpc", 10)],
    port,
  })
  .then((bound) => console.log(`READY ${bound}`))
  .catch((error) => {
    console.error(error);
    process.exit(1);
  });
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));
