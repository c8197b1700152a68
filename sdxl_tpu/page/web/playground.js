() => {
  // The playground page's own behaviour, beside Gradio's (app.py loads it once per page):
  // A1111's keys, the queue's position in words, a live region for the run panel, names for icon buttons.
  const generate = () => {
    const button = document.getElementById("generate");
    // (the one way a run starts: it obeys the run state; not from the Extras tab, where it is hidden)
    if (button && !button.disabled && button.offsetParent !== null) button.click();
  };
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.isComposing) return;
    const inNegative = event.target.closest && event.target.closest("#negative");
    if (event.ctrlKey || event.metaKey || (inNegative && !event.shiftKey && !event.altKey)) {
      event.preventDefault();
      event.stopPropagation();
      generate();
    }
  }, true);

  // The run state is the run panel's (data-state); which buttons can be pressed follows it, here, at
  // once: Generate while no run goes (and the model is ready: then Gradio enables it), Stop while one does.
  const panelState = () => document.querySelector("#progress .run-panel")?.dataset.state || "idle";
  const busy = (state) => state === "queued" || state === "running";
  const followState = () => {
    const run = busy(panelState());
    const button = document.getElementById("generate"), stop = document.getElementById("stop");
    if (button && run && !button.disabled) {
      button.disabled = true;
      button.dataset.runDisabled = "yes";
    } else if (button && !run && button.dataset.runDisabled === "yes") {
      button.disabled = false;
      delete button.dataset.runDisabled;
    }
    if (stop && stop.disabled === run) stop.disabled = !run;
  };
  document.addEventListener("click", (event) => {
    const button = event.target.closest && event.target.closest("#stop, #generate");
    if (!button || button.disabled) return;
    // Stop: the run's event fails as it is cancelled, and the page must not take that for a refusal.
    document.body.dataset.runStopped = button.id === "stop" ? "yes" : "no";
    if (button.id === "generate") setTimeout(() => {  // (after Gradio has taken the click)
      const panel = document.querySelector("#progress .run-panel");
      if (panel && !busy(panel.dataset.state)) {
        panel.dataset.state = "queued";
        panel.innerHTML = '<span class="run-text">Waiting for the server…</span>';
      }
      followState();
      // On a phone the results are under the form: the run brings them into view.
      if (window.matchMedia("(max-width: 767px)").matches) {
        document.getElementById("progress")?.scrollIntoView({block: "start", behavior: "smooth"});
      }
    }, 0);
  }, true);

  const words = (position) => position === 1
    ? "Waiting: yours is next in line."
    : `Waiting in line: ${position - 1} ${position === 2 ? "run" : "runs"} ahead of yours.`;
  const named = {"random-seed": "Random seed (-1)",
                 "reuse-seed": "Reuse the seed of the image shown large, else of the last run's first image",
                 "read-parameters": "Read generation parameters from the prompt box into the form"};
  const tidy = () => {
    const panel = document.getElementById("progress");
    if (panel && !panel.hasAttribute("role")) {
      panel.setAttribute("role", "status");
      panel.setAttribute("aria-live", "polite");
    }
    for (const [id, name] of Object.entries(named)) {
      const button = document.getElementById(id);
      if (button && button.getAttribute("aria-label") !== name) {
        button.setAttribute("aria-label", name);
        button.setAttribute("title", name);
      }
    }
    // Gradio's gallery: an empty state labelled without a role, thumbnails named without their caption.
    const empty = document.querySelector("#gallery .empty[aria-label]:not([role])");
    if (empty) empty.setAttribute("role", "img");
    const thumbnails = document.querySelectorAll("#gallery .grid-container button.thumbnail-item");
    thumbnails.forEach((thumbnail, i) => {
      const caption = thumbnail.querySelector(".caption-label");
      const name = `${caption ? caption.textContent.trim() + ", " : ""}image ${i + 1} of ${thumbnails.length}`;
      if (thumbnail.getAttribute("aria-label") !== name) thumbnail.setAttribute("aria-label", name);
    });
    // Gradio's tracker (hidden) says "queue: 2/3" while the run waits; the panel says it in words.
    const queued = panel && panel.querySelector('.run-panel[data-state="queued"] .run-text');
    if (queued) {
      const tracker = [...panel.querySelectorAll(".progress-text, .meta-text, .wrap")].map((e) => e.textContent).join(" ");
      const m = tracker.match(/queue:\s*(\d+)\s*\/\s*(\d+)/);
      const text = m ? words(Number(m[1])) : null;
      if (text && queued.textContent !== text) queued.textContent = text;
    }
    followState();
  };
  new MutationObserver(tidy).observe(document.body, {subtree: true, childList: true, characterData: true});
  tidy();
}
