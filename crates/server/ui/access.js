// The access page: the named credentials — the credentials file's and those an admin makes here —
// with their roles, namespaces and secrets, and the trail of changes made here. A new secret is
// shown once, on this page, and never again; retiring a secret or deleting a credential takes
// effect at once.

import { h, when } from "./dom.js";

const ROLES = ["worker", "operator", "admin"];

/// Renders the page into `container`; `shown` is a change's answer whose secret to show once.
export async function accessPage(container, deps, shown) {
  const { api, act, table, principalText } = deps;
  const [listed, trail] = await Promise.all([
    api("GET", "/auth/credentials"),
    api("GET", "/auth/credential-events?limit=20"),
  ]);
  const credentials = listed.credentials || [];
  const again = (answer) => accessPage(container, deps, answer);
  const enc = encodeURIComponent;

  const change = async (label, method, path, body) => {
    const answer = await act(label, () => api(method, path, body));
    if (answer !== undefined) await again(answer.secret ? answer : undefined);
  };

  const rows = credentials.map((c) => ({ ...c, managed: c.source === "api" }));
  container.replaceChildren(
    h("h1", {}, "Access"),
    h("p", { class: "muted" },
      "Named credentials: who a token acts as, with which roles, in which namespaces. ",
      "The credentials file's are changed in the file; those made here live in the database and take effect on every node within seconds."),
    shown ? secretOnce(shown) : null,
    table("Credentials", [
      ["Principal", (c) => h("strong", {}, c.principal)],
      ["Source", (c) => c.source],
      ["Roles", (c) => c.roles.join(", ")],
      ["Namespaces", (c) => (c.namespaces ? c.namespaces.join(", ") : "every namespace")],
      ["Secrets", (c) => secretsCell(c, change, enc)],
      ["Changed", (c) => (c.managed ? [when(c.updated_at), " by ", principalText(c.updated_by)] : "—")],
      ["", (c) => (c.managed ? h("div", { class: "actions" },
        h("button", { type: "button", onclick: () => change(`New secret for ${c.principal}`, "POST", `/auth/credentials/${enc(c.principal)}/secrets`) }, "New secret"),
        h("button", { type: "button", class: "danger", onclick: () => {
          if (confirm(`Delete ${c.principal}? None of its secrets will authenticate.`)) {
            change(`Deleted ${c.principal}`, "DELETE", `/auth/credentials/${enc(c.principal)}`);
          }
        } }, "Delete")) : "")],
    ], rows, "No named credentials yet."),
    newCredentialForm(change),
    table("Recent changes", [
      ["When", (e) => when(e.recorded_at)],
      ["Change", (e) => e.action.replace("credential.", "").replace("_", " ")],
      ["Principal", (e) => e.principal],
      ["Secret", (e) => (e.secret_id ? h("span", { class: "mono" }, e.secret_id) : "")],
      ["By", (e) => principalText(e.by)],
    ], trail.events || [], "No credential has been changed here."),
  );
}

function secretsCell(credential, change, enc) {
  if (!credential.managed) return `${credential.secret_count} (in the file)`;
  return h("ul", { class: "plain" }, credential.secrets.map((secret) => h("li", { "data-secret-id": secret.secret_id },
    h("span", { class: "mono" }, secret.secret_id), " ", when(secret.created_at), " ",
    credential.secrets.length > 1
      ? h("button", { type: "button", class: "link", onclick: () => change(`Retired a secret of ${credential.principal}`, "DELETE",
        `/auth/credentials/${enc(credential.principal)}/secrets/${enc(secret.secret_id)}`) }, "Retire")
      : null)));
}

function secretOnce(answer) {
  return h("div", { class: "card secret-once", role: "status", id: "new-secret" },
    h("h2", {}, `New secret for ${answer.credential.principal}`),
    h("p", {}, "Copy it now: it is not shown again. Only its digest is stored."),
    h("code", { id: "new-secret-token", class: "mono" }, answer.secret.token),
    h("p", { class: "muted" }, "Secret id ", h("span", { class: "mono" }, answer.secret.secret_id)));
}

function newCredentialForm(change) {
  const principal = h("input", { id: "credential-principal", required: true, maxlength: "128", autocomplete: "off" });
  const namespaces = h("input", { id: "credential-namespaces", placeholder: "every namespace", autocomplete: "off" });
  const roles = ROLES.map((role) => h("input", { type: "checkbox", id: `credential-role-${role}`, value: role }));
  const submit = (event) => {
    event.preventDefault();
    const bound = namespaces.value.split(",").map((n) => n.trim()).filter(Boolean);
    change(`Created ${principal.value.trim()}`, "POST", "/auth/credentials", {
      principal: principal.value.trim(),
      roles: roles.filter((box) => box.checked).map((box) => box.value),
      namespaces: bound.length ? bound : null,
    });
  };
  return h("form", { class: "card stack", onsubmit: submit, "aria-labelledby": "new-credential-title" },
    h("h2", { id: "new-credential-title" }, "New credential"),
    h("label", { for: "credential-principal" }, "Principal", principal),
    h("fieldset", {}, h("legend", {}, "Roles"),
      ROLES.map((role, i) => h("label", { for: `credential-role-${role}` }, roles[i], " ", role))),
    h("label", { for: "credential-namespaces" }, "Namespaces (comma-separated)", namespaces),
    h("div", {}, h("button", { class: "primary", type: "submit" }, "Create credential")));
}
