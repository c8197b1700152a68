"""Image work in plain PIL and numpy: an image a client gives decoded by its content, inpainting's
mask, fitting an image to a compiled size, and the hires fix's sizes and upscale."""
