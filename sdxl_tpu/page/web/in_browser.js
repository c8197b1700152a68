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
  // `offered`: the page's hidden field, what the menus offer now (page/in_browser.py's offered_now), as JSON.
  const offer = (offered) => { try { return JSON.parse(offered || "{}") || {}; } catch { return {}; } };
  // The preset whose (steps, sampler, guidance) the form holds, on the sampler as a request names it
  // (the menus' pair translated back).
  const matchingPreset = (steps, sampler, schedule, guidance, offered) => {
    const named = schedule === config.checkpointKarras ? sampler + config.karras : sampler;
    for (const name of offer(offered).presets || []) {
      const p = config.presets[name];
      if (p && p[0] === steps && p[1] === named && Math.abs(p[2] - guidance) < 1e-6) return name;
    }
    return config.custom;
  };
  // The Schedule type menu of the sampler chosen, the schedule kept where it runs on it, else the
  // first (page/sampler_menu.py's fitted_schedule): in the browser, as the sampler changes, so no
  // answer from the server can arrive after a later change and undo it.
  const fitSchedule = (sampler, schedule, offered) => {
    const menus = offer(offered).schedules;
    if (!menus) return {__type__: "update"};  // (not described yet: the menu as it is)
    const menu = (typeof sampler === "string" && Object.hasOwn(menus, sampler) && sampler) ? menus[sampler] : menus[""];
    const values = menu.map(([, value]) => value);
    return {__type__: "update", choices: menu,
            value: values.includes(schedule) ? schedule : (values.length ? values[0] : null)};
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
  // Stop pressed as the run ended (its images already in view): the run's own end stays said.
  const stoppedRun = (now) => typeof now === "string" && now.includes('data-state="done"') ? now
                                                                                        : config.panels.stopped;
  const example = (i) => config.examples[i];
  const generateIf = (ready) => { if (ready) document.querySelector("#generate").click(); };
  const randomSeed = () => -1;  // (A1111's -1: a seed drawn for the run)
  return {menuPair, matchingPreset, fitSchedule, presetFill, restoreHistory, failedRun, stoppedRun, example,
          generateIf, randomSeed};
}
