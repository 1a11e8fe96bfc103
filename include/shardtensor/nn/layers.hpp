#pragma once
/// \file layers.hpp
/// Umbrella header of the nn modules: activations, Conv / ConvTranspose / Linear, the norms,
/// Sequential and ResidualBlock, and UNet. Keep this a plain list.
#include "shardtensor/nn/activation_layers.hpp"
#include "shardtensor/nn/conv_layers.hpp"
#include "shardtensor/nn/norm_layers.hpp"
#include "shardtensor/nn/sequential.hpp"
#include "shardtensor/nn/unet.hpp"
