// The YAML editor's sweep count: asks the server how many tasks the spec expands to, as the
// user types (debounced) or presses the button. Submitting works without it.
(function () {
  "use strict";
  const form = document.getElementById("yaml-form");
  if (!form) return;
  const area = form.querySelector("textarea");
  const out = document.getElementById("sweep-preview");
  const button = document.getElementById("preview-button");
  let timer = null;

  async function preview() {
    const body = new FormData();
    body.append("spec", area.value);
    body.append("csrfmiddlewaretoken", form.querySelector("[name=csrfmiddlewaretoken]").value);
    const response = await fetch(form.dataset.preview, { method: "POST", body: body });
    const data = await response.json();
    if (data.count !== null) {
      out.textContent = out.dataset.count.replace("{n}", data.count);
    } else {
      const lines = Object.entries(data.errors).map(([k, v]) => k + ": " + v.join("; "));
      out.textContent = out.dataset.bad + " " + lines.join(" · ");
    }
  }
  button.addEventListener("click", preview);
  area.addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(preview, 400);
  });
  if (area.value.trim()) preview();
})();
