// Live refresh: call `tick` every `intervalMs` while the tab is visible and updates are on.
// Ticks never overlap (the next one is scheduled when the previous one ends), and a hidden
// tab costs nothing (no timer runs until it is visible again).

export function createPoller(tick, { intervalMs = 5000, onPause = () => {} } = {}) {
  let timer = null;
  let running = false;
  let enabled = true;
  let again = false;

  const schedule = () => {
    if (timer) window.clearTimeout(timer);
    timer = null;
    if (!enabled) { onPause("Updates paused"); return; }
    if (document.visibilityState !== "visible") { onPause("Paused (tab hidden)"); return; }
    timer = window.setTimeout(run, intervalMs);
  };

  async function run() {
    timer = null;
    if (running) { again = true; return; }
    running = true;
    try { await tick(); } finally {
      running = false;
      if (again) { again = false; run(); } else schedule();
    }
  }

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && enabled) run();
    else schedule();
  });

  return {
    /** Tick now (e.g. after navigation or an action), then keep the rhythm. */
    now() {
      if (timer) window.clearTimeout(timer);
      timer = null;
      run();
    },
    setEnabled(on) {
      enabled = on;
      if (on) this.now(); else schedule();
    },
  };
}
