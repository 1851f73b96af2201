/** A small element builder, so the views read as the markup they make; and the few widgets
 *  every page shares (a modal dialog, a copy button). */

type Child = Node | string | null | undefined | false;

/** `<tag attrs…>children</tag>`; attributes whose value is undefined are left out. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== undefined) {
      element.setAttribute(name, value);
    }
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      element.append(child);
    }
  }
  return element;
}

/** A button that runs `action` on click. */
export function button(
  attrs: Record<string, string | undefined>,
  label: Child | readonly Child[],
  action: (event: MouseEvent) => void,
): HTMLButtonElement {
  const children: readonly Child[] = Array.isArray(label) ? label : [label as Child];
  const element = h("button", { type: "button", ...attrs }, ...children);
  element.addEventListener("click", action);
  return element;
}

/**
 * A modal dialog (`<dialog>`, keyboard-trapped by the browser; Escape closes it) with `body`
 * and its buttons; `confirm` runs on the form's submit. Removed from the page once closed.
 */
export function openDialog(
  id: string,
  title: string,
  body: Child[],
  confirmLabel: string,
  confirm: (dialog: HTMLDialogElement) => void,
  options: { danger?: boolean } = {},
): HTMLDialogElement {
  const submit = h("button", { type: "submit", class: options.danger === true ? "danger" : "primary", id: `${id}-confirm` }, confirmLabel);
  const cancel = h("button", { type: "button", id: `${id}-cancel` }, "Cancel");
  const form = h(
    "form",
    { method: "dialog" },
    h("h2", {}, title),
    ...body,
    h("div", { class: "dialog-actions" }, cancel, submit),
  );
  const dialog = h("dialog", { id, "aria-label": title }, form);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    confirm(dialog);
  });
  cancel.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}

/** Put `text` on the clipboard (a hidden text area where the Clipboard API is not offered:
 *  pages served over plain HTTP from another machine). */
export async function copyText(text: string): Promise<void> {
  if (navigator.clipboard !== undefined && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = h("textarea", { class: "offscreen", "aria-hidden": "true" });
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

/** A small copy button for `text` (its label is drawn by CSS, so it adds no text to what it
 *  sits in); says "copied" for a moment. */
export function copyButton(text: () => string, what: string): HTMLButtonElement {
  const element = button({ class: "copy", "aria-label": `Copy ${what}`, title: `Copy ${what}` }, null, (event) => {
    event.stopPropagation();
    copyText(text()).then(
      () => flash(element, "copied"),
      () => flash(element, "failed"),
    );
  });
  return element;
}

function flash(element: HTMLElement, state: string): void {
  element.dataset.state = state;
  setTimeout(() => delete element.dataset.state, 1500);
}
