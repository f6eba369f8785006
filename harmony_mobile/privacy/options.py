"""The optional upload protections, off by default (docs/PRIVACY.md): label DP by randomized
response on tokens, and feature clipping + Gaussian noise."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harmony_mobile.privacy.feature_noise import check_feature_privacy


class UploadPrivacy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label_dp_epsilon: float | None = Field(
        default=None, gt=0, description="randomized response on each row's token at this epsilon; None = off"
    )
    feature_clip: float | None = Field(default=None, gt=0, description="L2 clip norm of each uploaded z")
    noise_multiplier: float | None = Field(
        default=None, ge=0, description="Gaussian noise std on z as a multiple of the clip norm"
    )

    @model_validator(mode="after")
    def _noise_needs_a_clip(self) -> UploadPrivacy:
        check_feature_privacy(self.feature_clip, self.noise_multiplier)
        return self
