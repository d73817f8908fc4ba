// lanefold view: live updates by server-sent events. Served from the package; nothing fetched.
"use strict";
(function () {
  const url = document.body.dataset.live;
  if (!url) return;
  const source = new EventSource(url);
  source.addEventListener("parts", (e) => {
    const parts = JSON.parse(e.data);
    for (const id of ["waves", "votes", "outcome"]) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = parts[id];
    }
    document.getElementById("status").textContent = parts.status;
    document.getElementById("timeline").insertAdjacentHTML("beforeend", parts.timeline);
  });
  source.addEventListener("rows", (e) => {
    const body = document.querySelector("#runs tbody");
    if (body) body.innerHTML = JSON.parse(e.data).html;
  });
  source.addEventListener("refused", (e) => {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = JSON.parse(e.data).line;
    document.querySelector("main").prepend(p);
    source.close();
  });
  source.addEventListener("end", () => source.close());
})();
