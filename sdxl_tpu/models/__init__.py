"""The networks, mirroring the checkpoint's module trees as diffusers' modeling files do: the CLIP
text encoders (clip.py), the UNet (unet.py), an image prompt's CLIP image encoder and IP-Adapter
(clip_vision.py, ip_adapter.py), the VAE (vae.py), TAESD for previews (taesd.py), the layers they
share (layers.py) and attention behind one function (attention.py)."""
