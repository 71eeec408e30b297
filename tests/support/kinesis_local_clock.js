// Preloaded into a kinesis-local whose clock a test moves forward (KinesisLocal(clock=True)):
// on SIGUSR2 the server's clock jumps ahead by the seconds written in $KDDB_CLOCK_FILE, as if
// that much time had passed (its 5-minute iterator expiry, for one, then happens at once).
"use strict";
const fs = require("fs");
let offsetMs = 0;
const perfNow = performance.now.bind(performance);
const dateNow = Date.now;
performance.now = () => perfNow() + offsetMs;
Date.now = () => dateNow() + offsetMs;
process.on("SIGUSR2", () => {
  offsetMs = 1000 * Number(fs.readFileSync(process.env.KDDB_CLOCK_FILE, "utf8"));
});
