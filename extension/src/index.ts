/**
 * ddpviz for JupyterLab: `.ddpviz` traces open in a viewer (double-click, 'Open With', or
 * 'Open ddpviz trace'), no kernel needed; 'New DDP debugging notebook' starts a notebook from
 * ddpviz's template (a 2-rank demo job). Both commands are in the palette and the launcher;
 * the viewer's colour scheme and event limit are settings (schema/plugin.json).
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { FileDialog, IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { Contents } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import template from '../../ddpviz/templates/ddp_debugging.ipynb';
import { FACTORY, FILE_TYPE, TraceDocument, TraceViewerFactory, ViewerSettings } from './widget';

/** The plugin id; its settings schema is schema/plugin.json. */
const PLUGIN_ID = 'ddpviz:plugin';

/** Command ids. */
export namespace CommandIDs {
  /** Create a notebook from ddpviz's template and open it. */
  export const newNotebook = 'ddpviz:new-notebook';
  /** Open a trace: `{path}` directly, else pick files in a dialog. */
  export const openTrace = 'ddpviz:open-trace';
}

/** Template notebooks are created as ddp-debugging.ipynb, ddp-debugging-1.ipynb, ... */
const NOTEBOOK_STEM = 'ddp-debugging';

const traceIcon = new LabIcon({
  name: 'ddpviz:trace',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">' +
    '<rect x="1" y="2" width="9" height="3" rx="0.5" fill="#4e79a7"/>' +
    '<rect x="3" y="6.5" width="11" height="3" rx="0.5" fill="#f28e2b"/>' +
    '<rect x="6" y="11" width="9" height="3" rx="0.5" fill="#59a14f"/></svg>'
});

/** The first free `ddp-debugging[-N].ipynb` in `cwd` (listing the folder: no 404s). */
async function freeNotebookPath(contents: Contents.IManager, cwd: string): Promise<string> {
  const listing = await contents.get(cwd, { content: true });
  const taken = new Set(
    (Array.isArray(listing.content) ? (listing.content as Contents.IModel[]) : []).map(m => m.name)
  );
  for (let i = 0; ; i++) {
    const name = i === 0 ? `${NOTEBOOK_STEM}.ipynb` : `${NOTEBOOK_STEM}-${i}.ipynb`;
    if (!taken.has(name)) {
      return PathExt.join(cwd, name);
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'ddpviz: a trace viewer and DDP debugging notebooks.',
  autoStart: true,
  requires: [IDocumentManager],
  optional: [ICommandPalette, ILauncher, ISettingRegistry, IDefaultFileBrowser, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    docManager: IDocumentManager,
    palette: ICommandPalette | null,
    launcher: ILauncher | null,
    settingRegistry: ISettingRegistry | null,
    browser: IDefaultFileBrowser | null,
    restorer: ILayoutRestorer | null
  ) => {
    const settings = new ViewerSettings();
    app.docRegistry.addFileType({
      name: FILE_TYPE,
      displayName: 'ddpviz trace',
      extensions: ['.ddpviz'],
      mimeTypes: ['application/x-ddpviz'],
      fileFormat: 'base64',
      contentType: 'file',
      icon: traceIcon
    });
    const factory = new TraceViewerFactory(
      {
        name: FACTORY,
        label: 'ddpviz trace viewer',
        fileTypes: [FILE_TYPE],
        defaultFor: [FILE_TYPE],
        modelName: 'base64',
        readOnly: true
      },
      settings
    );
    app.docRegistry.addWidgetFactory(factory);

    const tracker = new WidgetTracker<TraceDocument>({ namespace: 'ddpviz-trace' });
    factory.widgetCreated.connect((_, widget) => {
      widget.title.icon = traceIcon;
      void tracker.add(widget);
      widget.context.pathChanged.connect(() => void tracker.save(widget));
    });
    if (restorer) {
      void restorer.restore(tracker, {
        command: 'docmanager:open',
        args: widget => ({ path: widget.context.path, factory: FACTORY }),
        name: widget => widget.context.path
      });
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(loaded => {
          const apply = () =>
            settings.update({
              scheme: loaded.get('colorScheme').composite as string,
              maxEvents: loaded.get('maxEvents').composite as number
            });
          apply();
          loaded.changed.connect(apply);
        })
        .catch(reason => console.error(`ddpviz: could not load settings: ${reason}`));
    }

    const cwdOf = (args: Record<string, unknown>): string =>
      typeof args.cwd === 'string' ? args.cwd : (browser?.model.path ?? '');

    app.commands.addCommand(CommandIDs.newNotebook, {
      label: args => (args.isLauncher ? 'DDP debugging notebook' : 'New DDP debugging notebook'),
      caption: 'A notebook that launches a 2-rank DDP job and shows its buckets, events and trace',
      icon: args => (args.isPalette ? undefined : traceIcon),
      execute: async args => {
        const contents = app.serviceManager.contents;
        const path = await freeNotebookPath(contents, cwdOf(args));
        await contents.save(path, { type: 'notebook', format: 'json', content: template });
        return app.commands.execute('docmanager:open', { path, factory: 'Notebook' });
      }
    });

    app.commands.addCommand(CommandIDs.openTrace, {
      label: args => (args.isLauncher ? 'ddpviz trace' : 'Open ddpviz trace'),
      caption: 'Open a .ddpviz trace file in the trace viewer (no kernel needed)',
      icon: args => (args.isPalette ? undefined : traceIcon),
      execute: async args => {
        if (typeof args.path === 'string') {
          return docManager.openOrReveal(args.path, FACTORY);
        }
        const result = await FileDialog.getOpenFiles({
          manager: docManager,
          title: 'Open ddpviz trace',
          defaultPath: cwdOf(args),
          filter: model =>
            model.type === 'directory' || model.name.endsWith('.ddpviz') ? {} : null
        });
        for (const model of result.button.accept ? (result.value ?? []) : []) {
          if (model.type !== 'directory') {
            docManager.openOrReveal(model.path, FACTORY);
          }
        }
        return undefined;
      }
    });

    for (const command of [CommandIDs.newNotebook, CommandIDs.openTrace]) {
      palette?.addItem({ command, category: 'ddpviz', args: { isPalette: true } });
    }
    if (launcher) {
      launcher.add({ command: CommandIDs.newNotebook, category: 'ddpviz', rank: 1 });
      launcher.add({ command: CommandIDs.openTrace, category: 'ddpviz', rank: 2 });
    }
  }
};

export default plugin;
