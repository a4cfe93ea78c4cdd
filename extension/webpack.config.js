// Merged into @jupyter/builder's rspack config: notebooks imported from TypeScript (the
// template in ../ddpviz/templates) are bundled as JSON.
module.exports = {
  module: {
    rules: [{ test: /\.ipynb$/, type: 'json' }]
  }
};
