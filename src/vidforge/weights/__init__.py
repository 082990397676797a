"""A network's weights in and out of files: the export folder (checkpoint.py: model.safetensors and
config.json, nothing unpickled), a two-expert model's export (experts.py), safetensors written and read a
tensor at a time (safetensors_stream.py), a config held to its weights' headers before the model is built
(weights_check.py), and the one reader of a weights folder a user names (weights_folder.py). Above
`vidforge.models`, whose presets build the networks these fill."""
