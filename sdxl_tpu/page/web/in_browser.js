// What the page's events do in the browser, without a server event: the form's rules (the menus'
// (sampler, schedule) pair, the preset menu following the fields, a preset filling them, a history
// row restoring the form: each the same rule as its Python twin, page/sampler_menu.py's menu_pair,
// page/page.py's matching_preset, request/fields.py's restored fields; tests/page/test_in_browser.py runs
// both), and the run panel's answers to Stop and to a run the server did not take. `config`
// (page/in_browser.py's browser_config) carries the names and data they need.
(config) => {
  const menuPair = (sampler, schedule) => {
    if (typeof sampler !== "string" || !sampler.endsWith(config.karras)) return [sampler, schedule];
    return [sampler.slice(0, -config.karras.length),
            schedule === "Checkpoint" ? config.checkpointKarras : "Karras"];
  };
  // The preset whose (steps, sampler, guidance) the form holds, on the sampler as a request names it
  // (the menus' pair translated back); `offered`: the names the menu offers now, as JSON.
  const matchingPreset = (steps, sampler, schedule, guidance, offered) => {
    const named = schedule === config.checkpointKarras ? sampler + config.karras : sampler;
    for (const name of JSON.parse(offered || "[]")) {
      const p = config.presets[name];
      if (p && p[0] === steps && p[1] === named && Math.abs(p[2] - guidance) < 1e-6) return name;
    }
    return config.custom;
  };
  // Choosing a preset sets steps, the sampler (with the schedule its old A1111 name implies) and guidance.
  const presetFill = (preset, steps, sampler, schedule, guidance) => {
    const p = config.presets[preset];
    if (!p) return [steps, sampler, schedule, guidance];
    const [s, c] = menuPair(p[1], schedule === config.checkpointKarras ? "Checkpoint" : schedule);
    return [p[0], s, c, p[2]];
  };
  // A history row fills the form from the browser's copy of the run: each field the history keeps
  // (a run kept before an optional field existed ran on its default), the fields a restored run
  // sets (Randomize off: the run comes out the same), the others as they are.
  const restoreHistory = (index, history, ...form) => {
    const e = Array.isArray(history) ? history[index] : undefined;
    if (!e) return form;
    const values = config.fields.map((f, i) =>
      f.kept ? (e[f.name] ?? (f.fallback !== null ? f.fallback : form[i]))
             : (f.restored !== null ? f.restored : form[i]));
    [values[config.sampler], values[config.schedule]] = menuPair(values[config.sampler], values[config.schedule]);
    return values;
  };
  // A run that failed before its handler: stopped (the page script marks the page as Stop is pressed,
  // before Gradio cancels the event: the panel says so itself), else not taken (the queue full, or
  // the server stopping).
  const failedRun = (now) => document.body.dataset.runStopped === "yes" ? now : config.panels.notTaken;
  const stoppedRun = () => config.panels.stopped;
  const example = (i) => config.examples[i];
  const generateIf = (ready) => { if (ready) document.querySelector("#generate").click(); };
  const randomSeed = () => -1;  // (A1111's -1: a seed drawn for the run)
  return {menuPair, matchingPreset, presetFill, restoreHistory, failedRun, stoppedRun, example, generateIf,
          randomSeed};
}
