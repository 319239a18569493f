"""Sizes read from the media themselves: image sizes and audio durations from their headers, and the vision
tokens a model's processor makes of an image of that size; the size kinds ``image_tokens``, ``image_patches``,
``image_count`` and ``audio_frames`` (``inputs.size_kinds``) measure through here (docs/multimodal.md)."""
