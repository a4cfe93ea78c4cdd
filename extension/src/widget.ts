/**
 * The document side of the viewer: `.ddpviz` files are read as base64 through the Jupyter
 * contents API (no kernel), parsed, and rendered into a panel that follows the settings and
 * re-renders when the file is reverted or reloaded from disk.
 */

import { ABCWidgetFactory, DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { DEFAULT_SCHEME } from './colors';
import { Picks } from './dom';
import { TraceModel } from './eventModel';
import { base64ToBytesAsync, parseTraceAsync, TraceError } from './trace';
import { renderError, renderLoading, renderTrace, ViewOptions } from './view';

/** The widget factory's name (also in 'Open With'). */
export const FACTORY = 'ddpviz trace viewer';

/** The file type's name. */
export const FILE_TYPE = 'ddpviz';

/** Viewer settings shared by every open viewer; `changed` fires when the user edits them. */
export class ViewerSettings {
  /** The current options. */
  get options(): ViewOptions {
    return this._options;
  }

  /** Fired after `update`. */
  get changed(): ISignal<ViewerSettings, void> {
    return this._changed;
  }

  /** Replace the options (from the settings registry) and notify the viewers. */
  update(options: Partial<ViewOptions>): void {
    this._options = { ...this._options, ...options };
    this._changed.emit();
  }

  private _options: ViewOptions = { scheme: DEFAULT_SCHEME, maxEvents: 20000 };
  private _changed = new Signal<ViewerSettings, void>(this);
}

/** The panel inside a trace document. */
export class TraceViewer extends Widget {
  /**
   * @param context - the document context of a `.ddpviz` file (base64 model).
   * @param settings - the shared viewer settings.
   */
  constructor(
    private readonly _context: DocumentRegistry.IContext<DocumentRegistry.IModel>,
    private readonly _settings: ViewerSettings
  ) {
    super();
    this.addClass('ddpviz-viewer');
    this.node.tabIndex = 0;
    void _context.ready.then(() => {
      this._load();
      _context.model.contentChanged.connect(this._load, this);
      _settings.changed.connect(this._render, this);
    });
  }

  /** The parsed trace (null before it loads or when it failed to). */
  get model(): TraceModel | null {
    return this._model;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._settings.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _load(): void {
    void this._loadAsync();
  }

  /** Parse in slices (see parseTraceAsync), then draw; "loading" shows meanwhile. */
  private async _loadAsync(): Promise<void> {
    const name = this._context.path.split('/').pop() ?? this._context.path;
    const load = ++this._loads;
    if (this._model === null && this._error === null) {
      this._render();
    }
    try {
      const bytes = await base64ToBytesAsync(this._context.model.toString());
      const parsed = await parseTraceAsync(bytes, name);
      if (load !== this._loads) {
        return; // the file changed again while this load was parsing: the newer load draws
      }
      this._model = new TraceModel(parsed);
      this._error = null;
      // draw in a task of its own: building the model and drawing each take ~0.1 s at 256 ranks
      await new Promise(resolve => setTimeout(resolve, 0));
      if (load !== this._loads) {
        return;
      }
    } catch (err) {
      if (load !== this._loads) {
        return;
      }
      this._model = null;
      this._error =
        err instanceof TraceError
          ? err.message
          : `ddpviz: '${name}' could not be read: ${err}.\nReopen the file; if it persists, ` +
            'load it in Python with ddpviz.Trace.load to see the full error.';
      console.warn(this._error);
    }
    this._render();
  }

  private _render(): void {
    const name = this._context.path.split('/').pop() ?? this._context.path;
    const content =
      this._model !== null
        ? renderTrace(this._model, name, { ...this._settings.options, picks: this._picks })
        : this._error !== null
          ? renderError(this._error)
          : renderLoading(name);
    this.node.replaceChildren(content);
  }

  private _model: TraceModel | null = null;
  /** What the user picked (the replay's cursor included), kept across a settings redraw. */
  private _picks: Picks = {};
  private _error: string | null = null;
  private _loads = 0;
}

/** A trace file in the main area. */
export class TraceDocument extends DocumentWidget<TraceViewer> {}

/** Creates viewers for `.ddpviz` files. */
export class TraceViewerFactory extends ABCWidgetFactory<TraceDocument> {
  /**
   * @param options - the factory options (name, file types, model name "base64").
   * @param _settings - the shared viewer settings.
   */
  constructor(
    options: DocumentRegistry.IWidgetFactoryOptions<TraceDocument>,
    private readonly _settings: ViewerSettings
  ) {
    super(options);
  }

  protected createNewWidget(
    context: DocumentRegistry.IContext<DocumentRegistry.IModel>
  ): TraceDocument {
    const content = new TraceViewer(context, this._settings);
    return new TraceDocument({ content, context });
  }
}
